"""``gcloud compute ssh``: the SSH key (made when absent, added to the project's metadata or OS
Login), the firewall, then a session on the VM's fake machine (:mod:`~tpu_rl_sandbox.machines.hosts`)."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import re
import time
from pathlib import Path

from tpu_rl_sandbox.clis.gcloud.compute_instances import InstancesCommands
from tpu_rl_sandbox.clis.gcloud.compute_project_info import ProjectInfoCommands
from tpu_rl_sandbox.clis.gcloud.output import GcloudError
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse, GcloudUsageError
from tpu_rl_sandbox.clis.gcloud.values import parse_duration
from tpu_rl_sandbox.world import inventory, vpc
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.store import StateStore
from tpu_rl_sandbox.world.timescale import guest_boot_seconds, guest_seconds

DEFAULT_SSH_KEY_FILE = "~/.ssh/google_compute_engine"  # command_lib/util/ssh/ssh.py Keys.DEFAULT_KEY_FILE
# compute/ssh_utils.NetworkError, raised when the poll after a newly added key gives up.
NETWORK_ERROR = (
    "Could not SSH into the instance.  It is possible that your SSH key has not propagated to the "
    "instance yet. Try running this command again.  If you still cannot connect, verify that the "
    "firewall and instance are set to accept ssh traffic."
)
# The poll's tries (command_lib/util/ssh/ssh.py SSHPoller: sleep_ms 5 s; compute/ssh_utils
# SSH_KEY_PROPAGATION_TIMEOUT_MS 60 s, core/util/retry.Retryer: no try once the time passed plus
# the next sleep exceeds it), in real seconds.
SSH_POLL_SLEEP_SECONDS = 5.0
SSH_POLL_MAX_WAIT_SECONDS = 60.0


def _ssh_key_expiry(entry: str) -> dt.datetime | None:
    """compute/ssh_utils._SSHKeyExpiration: ``user:type key google-ssh {"expireOn": ...}``."""
    parts = entry.split()
    if len(parts) < 4 or parts[2] != "google-ssh":
        return None
    try:
        expire_on = json.loads(" ".join(parts[3:]))["expireOn"]
        return dt.datetime.strptime(expire_on, "%Y-%m-%dT%H:%M:%S+0000").replace(tzinfo=dt.UTC)
    except (ValueError, KeyError):
        return None


def project_ssh_key_entries(layout: SandboxLayout, project: str) -> list[str]:
    """The ``ssh-keys`` entries of the project's metadata, as ``gcloud compute ssh`` wrote them."""
    metadata = StateStore(layout).read("project_metadata").get(project, {})
    return list(metadata.get("ssh-keys", []))


def project_ssh_keys(layout: SandboxLayout, project: str) -> list[str]:
    """The distinct public keys (``ssh-rsa AAAA...``) in the project's metadata, unexpired ones.

    One key kept across calls is one entry here. gcloud writes a new metadata *entry* for each call
    with ``--ssh-key-expire-after`` (the entry carries its ``expireOn``), pruning expired entries
    when it rewrites the metadata: :func:`project_ssh_key_entries` lists those.
    """
    now = dt.datetime.now(dt.UTC)
    keys: list[str] = []
    for entry in project_ssh_key_entries(layout, project):
        expiry = _ssh_key_expiry(entry)
        if expiry is not None and expiry < now:
            continue
        parts = entry.split(":", 1)[-1].split()
        key = " ".join(parts[:2])
        if key not in keys:
            keys.append(key)
    return keys


def _posix_username(account: str) -> str:
    """The OS Login POSIX username of an account: ``sa_<unique id>`` for a service account, the
    e-mail with every other character as ``_`` for a user (OS Login docs, "username"), 32 at most."""
    if account.endswith(".gserviceaccount.com"):
        return "sa_" + str(int(hashlib.sha256(account.encode()).hexdigest()[:15], 16))[:18]
    return re.sub(r"[^a-z0-9_]", "_", account.lower())[:32]


class SshCommand(InstancesCommands, ProjectInfoCommands):
    """``gcloud compute ssh``."""

    def _ssh_key_expiration(self, parsed: GcloudParse) -> dt.datetime | None:
        """compute/ssh_utils.GetSSHKeyExpirationFromArgs / AddSSHKeyExpirationArgs."""
        dotted = parsed.command.dotted
        if {"ssh-key-expiration", "ssh-key-expire-after"} <= parsed.given:
            raise GcloudUsageError(
                dotted,
                "argument --ssh-key-expiration: At most one of --ssh-key-expiration | --ssh-key-expire-after "
                "can be specified.",
            )
        now = dt.datetime.now(dt.UTC)
        if parsed.get("ssh-key-expire-after"):
            raw = str(parsed.get("ssh-key-expire-after"))
            try:
                seconds = parse_duration(raw)
            except ValueError as error:
                raise GcloudUsageError(
                    dotted, f"argument --ssh-key-expire-after: Failed to parse duration: {error}"
                ) from None
            if seconds < 1:
                raise GcloudUsageError(
                    dotted,
                    f"argument --ssh-key-expire-after: value must be greater than or equal to 1s; received: {raw}",
                )
            return now + dt.timedelta(seconds=seconds)
        if parsed.get("ssh-key-expiration"):
            raw = str(parsed.get("ssh-key-expiration"))
            try:
                moment = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
            except ValueError:
                raise GcloudUsageError(
                    dotted, f"argument --ssh-key-expiration: Failed to parse date/time: {raw}"
                ) from None
            moment = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
            if moment < now:
                raise GcloudUsageError(
                    dotted, f"argument --ssh-key-expiration: Date/time must be in the future: {raw}"
                )
            return moment
        return None

    def _ensure_ssh_key(self, parsed: GcloudParse, user: str) -> str:
        """The public key (``ssh-rsa AAAA... comment``) of ``--ssh-key-file`` (default
        ``~/.ssh/google_compute_engine``), made with ``ssh-keygen -N '' -t rsa -f PATH`` when absent
        (command_lib/util/ssh/ssh.py Keys.EnsureKeysExist / Validate / KeygenCommand)."""
        home = self.env.get("HOME") or str(Path.home())
        raw = str(parsed.get("ssh-key-file") or DEFAULT_SSH_KEY_FILE)
        path = Path(home + raw[1:] if raw == "~" or raw.startswith("~/") else raw)
        if not path.is_absolute():
            path = Path.cwd() / path
        public = Path(str(path) + ".pub")

        def first_line(file: Path) -> str | None:
            try:
                return (file.read_text().splitlines() or [""])[0].strip() or None
            except OSError:
                return None

        private_line, public_line = first_line(path), first_line(public)
        if public_line is not None and not re.fullmatch(r"(ssh|ecdsa)-\S+ \S+( .*)?", public_line):
            self.err(f"WARNING: The public SSH key file [{public}] is corrupt.\n")
            public_line = None
        present = (private_line is not None, public_line is not None)
        if present == (True, True):
            return str(public_line)
        if present == (False, False) and not path.exists() and not public.exists():
            self.err(
                "WARNING: The private SSH key file for gcloud does not exist.\n"
                "WARNING: The public SSH key file for gcloud does not exist.\n"
                "WARNING: You do not have an SSH key for gcloud.\n"
                "WARNING: SSH keygen will be executed to generate a key.\n"
            )
        else:
            status = [
                ("private key", "PRESENT" if present[0] else "BROKEN" if path.exists() else "ABSENT", path),
                (
                    "public key",
                    "PRESENT" if present[1] else "BROKEN" if public.exists() else "ABSENT",
                    public,
                ),
            ]
            lines = "".join(
                f"{kind:<15} {'(' + state + ')':<10} [{file}]\n" for kind, state, file in sorted(status)
            )
            self.err(
                f"WARNING: Your SSH key files are broken.\n{lines}We are going to overwrite all above files.\n"
            )
            if not parsed.get("force-key-file-overwrite"):
                raise GcloudError("Aborted by user.")
            path.unlink(missing_ok=True)
            public.unlink(missing_ok=True)
        if not path.parent.exists():
            path.parent.mkdir(parents=True, mode=0o700)
        material = base64.b64encode(b"\x00\x00\x00\x07ssh-rsa" + os.urandom(270)).decode()
        hostname = self.env.get("HOSTNAME") or "localhost"
        public_text = f"ssh-rsa {material} {user}@{hostname}"
        private_text = (
            "-----BEGIN OPENSSH PRIVATE KEY-----\n"
            + base64.b64encode(b"openssh-key-v1\x00tpu-rl-sandbox stand-in " + os.urandom(96)).decode()
            + "\n-----END OPENSSH PRIVATE KEY-----\n"
        )
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(private_text)
        os.chmod(path, 0o600)
        public.write_text(public_text + "\n")
        os.chmod(public, 0o644)
        self.err(
            "Generating public/private rsa key pair.\n"
            f"Your identification has been saved in {path}\nYour public key has been saved in {public}\n"
        )
        return public_text

    def _add_project_ssh_key(
        self, project: str, user: str, public_key: str, expiration: dt.datetime | None
    ) -> bool:
        """compute/ssh_utils._AddSSHKeyToMetadataMessage + _PrepareSSHKeysValue: the entry is
        added to the project's ``ssh-keys`` only when that exact entry is not there; expired
        entries are dropped whenever the value is rewritten. True when the metadata changed."""
        if expiration is None:
            entry = f"{user}:{public_key}"
        else:
            key = " ".join(public_key.split()[:2])
            expire_on = expiration.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S+0000")
            blob = json.dumps({"userName": user, "expireOn": expire_on}).replace(" ", "")
            entry = f"{user}:{key} google-ssh {blob}"
        now = dt.datetime.now(dt.UTC)
        with self.store.txn() as txn:
            metadata = txn.doc("project_metadata").setdefault(project, {})
            entries: list[str] = metadata.setdefault("ssh-keys", [])
            if entry in entries:
                return False
            kept = [e for e in entries if (_ssh_key_expiry(e) or now) >= now]
            metadata["ssh-keys"] = [*kept, entry]
            txn.save("project_metadata")
        return True

    def _os_login(self, project: str) -> bool:
        """command_lib/util/ssh/ssh.py FeatureEnabledInMetadata / MetadataHasEnable: the project's
        ``enable-oslogin`` item, ``.lower() == 'true'`` (the sandbox's VMs carry no instance metadata)."""
        value = self._project_metadata(project).get("enable-oslogin")
        return isinstance(value, str) and value.lower() == "true"

    def _refused(self, iap: bool, name: str) -> None:
        """ssh's failure to connect to a guest whose sshd does not listen yet: OpenSSH's refused
        connect (sshconnect.c), or through IAP the tunnel's 4003 (no backend on port 22)."""
        if iap:
            self.err(
                "ERROR: (gcloud.compute.start-iap-tunnel) Error while connecting "
                "[4003: 'failed to connect to backend']. (Failed to connect to port 22)\n"
                "kex_exchange_identification: Connection closed by remote host\n"
            )
        else:
            self.err(f"ssh: connect to host {inventory.external_ip(name)} port 22: Connection refused\n")

    def _poll_until_sshd(self, answers_at: float, iap: bool, name: str, minute_seconds: float) -> None:
        """surface/compute/ssh.py after a newly added key: ``ssh_utils.CreateSSHPoller`` tries ``:``
        over ssh until it connects, every 5 s for 60 s (on the guest's scale), each failed try's
        stderr shown; past that, ``ssh_utils.NetworkError``."""
        sleep = guest_seconds(minute_seconds, SSH_POLL_SLEEP_SECONDS)
        max_wait = guest_seconds(minute_seconds, SSH_POLL_MAX_WAIT_SECONDS)
        started = time.time()
        while time.time() < answers_at:
            self._refused(iap, name)
            if time.time() - started + sleep > max_wait:
                raise GcloudError(NETWORK_ERROR)
            time.sleep(sleep)

    def cmd_compute_ssh(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        targets = list(parsed.positionals["USER_AT_INSTANCE"])
        if not targets:
            raise GcloudError("argument [USER@]INSTANCE: Must be specified.", code=2)
        target, extra = targets[0], targets[1:]
        user, _, name = target.rpartition("@")
        user = user or self.env.get("USER") or "sandbox"
        zone = self.zone(parsed, name)
        record = self._vm(project, zone, name)
        expiration = self._ssh_key_expiration(parsed)
        public_key = self._ensure_ssh_key(parsed, user)
        if record["status"] != "RUNNING":
            # A stopped VM has no external IP (ssh_utils.GetExternalInterface: an access config
            # without natIP raises UnallocatedIPAddressError); through IAP, the tunnel has no backend:
            # the websocket's close "%r: %r" of code 4003 (iap_tunnel_websocket_helper._OnClose) in
            # iap_tunnel_websocket's "Error while connecting [%s].%s" with its 4003 hint.
            if parsed.get("tunnel-through-iap"):
                self.err(
                    "ERROR: (gcloud.compute.start-iap-tunnel) Error while connecting "
                    "[4003: 'failed to connect to backend']. (Failed to connect to port 22)\n"
                )
                self.err("kex_exchange_identification: Connection closed by remote host\n")
                self.err("ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].\n")
                return 255
            raise GcloudError(
                f"Instance [{name}] in zone [{zone}] has not been allocated an external IP address yet. "
                "Try rerunning this command later."
            )
        os_login = self._os_login(project)
        keys_newly_added = False
        if os_login:
            # command_lib/util/ssh/ssh.py GetOsloginState: the key goes to the caller's OS Login
            # profile, not the metadata, and the session's user is the profile's POSIX username.
            user = _posix_username(self.account())
        elif self._add_project_ssh_key(project, user, public_key, expiration):
            keys_newly_added = True
            self.err(
                "Updating project ssh metadata...⠹Updated "
                f"[https://www.googleapis.com/compute/v1/projects/{project}].\n"
                "Updating project ssh metadata...done.\nWaiting for SSH key to propagate.\n"
            )
        # The connection: from the worker's address to the external IP, or from IAP's range with
        # --tunnel-through-iap; a firewall that lets neither in leaves ssh's connect to time out.
        # surface/compute/ssh.py: after a new key, the poller retries until SSH_KEY_PROPAGATION_TIMEOUT
        # and raises ssh_utils.NetworkError; otherwise ssh's own exit 255 is reported.
        source = vpc.IAP_ADDRESS if parsed.get("tunnel-through-iap") else vpc.CALLER_ADDRESS
        network = str(record.get("network") or vpc.DEFAULT_NETWORK)
        if not vpc.ingress_allowed(vpc.read_vpc(self.store, project), network, source, 22):
            self.err(f"ssh: connect to host {inventory.external_ip(name)} port 22: Connection timed out\n")
            if keys_newly_added:
                raise GcloudError(NETWORK_ERROR)
            self.err("ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].\n")
            return 255
        # The guest boots after RUNNING (each create, each start): until its sshd listens, the
        # connection is refused. A newly added key's poll tries again; else ssh's 255 is reported.
        boot = record.get("lastStartTimestamp") or record["created"]  # its last boot
        booted = dt.datetime.fromisoformat(str(boot).replace("Z", "+00:00")).timestamp()
        settings = load_settings(self.layout)
        answers_at = booted + guest_boot_seconds(settings.minute_seconds, settings.capacity_minutes)
        iap = bool(parsed.get("tunnel-through-iap"))
        if keys_newly_added:
            self._poll_until_sshd(answers_at, iap, name, settings.minute_seconds)
        elif time.time() < answers_at:
            self._refused(iap, name)
            self.err("ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].\n")
            return 255
        denied = settings.denied_permissions
        if os_login and {"compute.instances.osLogin", "compute.instances.osAdminLogin"} <= set(denied):
            # the guest's OS Login authorizes neither login: sshd refuses the key.
            self.err(f"{user}@{inventory.external_ip(name)}: Permission denied (publickey).\n")
            self.err("ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].\n")
            return 255
        sudoer = not os_login or "compute.instances.osAdminLogin" not in denied
        if self.faults().fire("ssh") is not None:
            self.err(f"ssh: connect to host {inventory.external_ip(name)} port 22: Connection timed out\n")
            self.err("ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].\n")
            return 255
        command = parsed.get("command")
        if command is None and extra:
            command = " ".join(extra)
        # the VM's simulated machine, imported only by the calls that reach it
        from tpu_rl_sandbox.machines import hosts
        from tpu_rl_sandbox.machines.vm_services import vm_services

        services = vm_services(self.layout, dict(self.env), project, zone, name, record)
        boot_apt = settings.boot_apt_seconds
        vm = hosts.VmHost(
            self.layout.vm_dir(name),
            services,
            name,
            user,
            project,
            list(record.get("scopes", [])),
            apt_busy_until=(booted + boot_apt / 2, booted + boot_apt),
            sudoer=sudoer,
            machine_type=str(record.get("machineType") or ""),
            zone=zone,
            layout_root=self.layout.root,
            credential_helper=load_settings(self.layout).vm_docker_credential_helper,
            tpu_vfio=bool((record.get("image") or {}).get("tpuVfio")),
        )
        stdin = self.read_stdin()
        if command is None:
            # ssh without a command runs the login shell on stdin (no terminal: no prompt).
            self.err("Pseudo-terminal will not be allocated because stdin is not a terminal.\n")
        # sshd runs a command as `<login shell> -c <command>`.
        argv = ["-bash"] if command is None else ["bash", "-c", str(command)]
        status = vm.run_session(argv, stdin, self.out, self.err, self.env)
        if vm.preempted:
            # The VM shut down under the session: sshd closed the connection (OpenSSH clientloop.c
            # "Connection to %s closed by remote host.", exit 255), gcloud reports ssh's exit code.
            self._preempt_vm(project, zone, name)
            self.err(f"Connection to {inventory.external_ip(name)} closed by remote host.\n")
            self.err("ERROR: (gcloud.compute.ssh) [/usr/bin/ssh] exited with return code [255].\n")
            return 255
        return status
