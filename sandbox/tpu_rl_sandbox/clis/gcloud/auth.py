"""``gcloud auth``, ``config`` and ``version``: the account, the properties, the SDK; and which
commands run without credentials."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tpu_rl_sandbox.clis.gcloud.call import GcloudCall
from tpu_rl_sandbox.clis.gcloud.output import formatted
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.world.settings import load_settings

# What `gcloud version` reports of the Cloud SDK 528 this machine has: its core components, and the
# versions of the optional ones the sandbox setting ``gcloud_components`` may add.
SDK_COMPONENTS: dict[str, str] = {
    "Google Cloud SDK": "528.0.0",
    "bq": "2.1.18",
    "core": "2025.06.20",
    "gcloud-crc32c": "1.0.0",
    "gsutil": "5.34",
}
OPTIONAL_COMPONENTS: dict[str, str] = {
    "alpha": "2025.06.20",
    "beta": "2025.06.20",
    "gke-gcloud-auth-plugin": "0.5.10",
    "kubectl": "1.32.4",
}
# Commands that run without credentials (they call no API): every other one needs an active account,
# and is the one that says it impersonates.
ACCOUNT_FREE_COMMANDS = {
    ("auth", "list"),
    ("auth", "configure-docker"),
    ("version",),
    ("config", "get-value"),
}
# googlecloudsdk/core/credentials/exceptions.py NoActiveAccountException, as AuthenticationException
# words it (should_relogin, not for_adc: the login command, then the switch-account text).
NO_ACTIVE_ACCOUNT = (
    "You do not currently have an active account selected.\nPlease run:\n\n  $ gcloud auth login\n\n"
    "to obtain new credentials.\n\nIf you have already logged in with a different account, run:\n\n"
    "  $ gcloud config set account ACCOUNT\n\nto select an already authenticated account to use."
)
# surface/auth/list.py Epilog when no account was displayed (printed only with the default format).
NO_CREDENTIALED_ACCOUNTS = (
    "\nNo credentialed accounts.\n\nTo login, run:\n  $ gcloud auth login `ACCOUNT`\n\n"
)
_FILTER_KEY_RE = re.compile(r"([A-Za-z_][\w.]*)\s*(?:!=|<=|>=|[:=~<>])")


class AuthCommands(GcloudCall):
    """``gcloud auth configure-docker|list``, ``config get-value``, ``version``."""

    def cmd_auth_configure_docker(self, parsed: GcloudParse) -> int:
        raw = (
            parsed.positionals.get("REGISTRIES")
            or "gcr.io,us.gcr.io,eu.gcr.io,asia.gcr.io,staging-k8s.gcr.io,marketplace.gcr.io"
        )
        registries = [r.strip() for r in str(raw).split(",") if r.strip()]
        config_dir = Path(
            self.env.get("DOCKER_CONFIG") or Path(self.env.get("HOME", str(Path.home()))) / ".docker"
        )
        config_file = config_dir / "config.json"
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError):
            config = {}
        helpers = config.setdefault("credHelpers", {})
        missing = [r for r in registries if helpers.get(r) != "gcloud"]
        if not missing:
            self.err("gcloud credential helpers already registered correctly.\n")
            return 0
        self.err("Adding credentials for: " + ",".join(missing) + "\n")
        for registry in missing:
            helpers[registry] = "gcloud"
        config_dir.mkdir(parents=True, exist_ok=True)
        config_file.write_text(json.dumps(config, indent=2))
        self.err("Docker configuration file updated.\n")
        return 0

    def cmd_auth_list(self, parsed: GcloudParse) -> int:
        if not load_settings(self.layout).gcloud_logged_in:
            # No account to display: display_taps.py Filterer.Done warns about every filter key
            # (none was present in any resource), then the command's Epilog (default format only).
            keys = sorted(set(_FILTER_KEY_RE.findall(str(parsed.get("filter") or ""))))
            if keys:
                self.err(
                    f"WARNING: The following filter keys were not present in any resource : {', '.join(keys)}\n"
                )
            if not parsed.get("format"):
                self.err(NO_CREDENTIALED_ACCOUNTS)
            return 0
        account = self.env.get("CLOUDSDK_CORE_ACCOUNT", "sandbox-user@example.com")
        self.out(
            formatted(
                [{"account": account, "status": "ACTIVE"}], parsed.get("format"), default="value(account)"
            )
        )
        return 0

    def cmd_auth_print_access_token(self, parsed: GcloudParse) -> int:
        """``gcloud auth print-access-token``: the active account's OAuth access token."""
        self.out("ya29.sandbox-token\n")
        return 0

    def cmd_version(self, parsed: GcloudParse) -> int:
        """``gcloud version``: the SDK and its installed components (surface/version.py prints
        ``NAME VERSION`` lines; ``--format=json`` an object)."""
        installed = load_settings(self.layout).gcloud_components
        components = dict(
            sorted({**SDK_COMPONENTS, **{c: OPTIONAL_COMPONENTS[c] for c in installed}}.items())
        )
        if parsed.get("format"):
            self.out(formatted(components, parsed.get("format")))
        else:
            self.out("".join(f"{name} {version}\n" for name, version in components.items()))
        return 0

    def cmd_config_get_value(self, parsed: GcloudParse) -> int:
        name = str(parsed.positionals["PROPERTY"])
        env_name = {"project": "CLOUDSDK_CORE_PROJECT", "account": "CLOUDSDK_CORE_ACCOUNT"}.get(
            name.split("/")[-1], "CLOUDSDK_" + name.replace("/", "_").upper()
        )
        value = self.env.get(env_name)
        if value:
            self.out(value + "\n")
        else:
            self.err("(unset)\n")
        return 0
