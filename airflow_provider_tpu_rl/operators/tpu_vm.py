"""Single-host pipeline (seed 002): one reservation-bound v6e-8 TPU VM driven over SSH, and a CPU VM
for the checkpoint conversions (MaxText's converters run on the CPU only)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.providers.common.compat.sdk import Context

from airflow_provider_tpu_rl.assets import (
    converted_checkpoint_asset_uri,
    emit_asset_events,
    leave_converted_event,
)
from airflow_provider_tpu_rl.compat import AirflowException, AirflowFailException
from airflow_provider_tpu_rl.exceptions import (
    CommandError,
    ConfigurationError,
    FailureKind,
    LeaseHeldError,
    RunDirBusyError,
)
from airflow_provider_tpu_rl.ledger.collect import CAPACITY_XCOM_KEY
from airflow_provider_tpu_rl.ledger.model_card import base_model_facts
from airflow_provider_tpu_rl.ledger.records import NUM_TEST_BATCHES_METRIC, reward_summary
from airflow_provider_tpu_rl.lineage import (
    Lineage,
    LineageMixin,
    conversion_lineage,
    export_lineage,
    training_lineage,
)
from airflow_provider_tpu_rl.maxtext.layout import (
    CONVERTED_CHECKPOINT_ITEMS,
    CONVERTED_CHECKPOINT_STEP,
    run_dir,
)
from airflow_provider_tpu_rl.maxtext.logs import TrainingLogTracker
from airflow_provider_tpu_rl.operators import billing
from airflow_provider_tpu_rl.operators.base import GclusterBaseOperator, expiry_of_run, fail_fast
from airflow_provider_tpu_rl.operators.gke import (
    delete_run_bucket,
    lease_ttl,
    read_resource_record,
    write_resource_record,
)
from airflow_provider_tpu_rl.operators.takeover import DEFAULT_STOP_TIMEOUT, displaced_attempt, prove_dead
from airflow_provider_tpu_rl.records.grants import Binding, RunGrants, carried_grants
from airflow_provider_tpu_rl.records.lease import (
    ClusterLeaseHook,
    Lease,
    held_message,
    utc_text,
    vm_lease_name,
)
from airflow_provider_tpu_rl.records.run_dirs import (
    VM,
    RunDirRecord,
    RunDirRecords,
    TrainingAttempt,
    WriterClaim,
    attempt_from_log,
    claim_kept_alive,
    vouches,
)
from airflow_provider_tpu_rl.records.writers import VmWriter
from airflow_provider_tpu_rl.render import boot_image, gke, tpu_vm
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.cluster import RESERVATION, CpuVmSpec, TpuVmSpec, default_capacity
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.pipeline import (
    TPU_VM_DEFAULTS,
    TpuVmPipelineSpec,
    tpu_vm_pipeline_from_conf,
)
from airflow_provider_tpu_rl.spec.preflight import error_line, parse_json_document
from airflow_provider_tpu_rl.timeouts import stage_command_timeout
from airflow_provider_tpu_rl.toolchain.failures import capacity_refused

DEFAULT_MODEL = str(TPU_VM_DEFAULTS["model"])
# create_vm's XCom of the capacity that served the TPU VM (the ledger's record_run reads it)
CAPACITY_XCOM = CAPACITY_XCOM_KEY


def vm_create_command(
    conf: Mapping[str, Any],
    *,
    dag_id: str,
    run_id: str,
    machine: str,
    expires_at: int,
    boot_family: str | None = None,
) -> tuple[TpuVmSpec | CpuVmSpec, Command]:
    """The run's VM (``machine``: ``tpu`` or ``cpu``) with its labels, and its create argv, from the
    create's conf and boot image family (what its resource record keeps): the create task and a
    train retry that re-creates a lost TPU VM render the same argv."""
    values = dict(conf)
    # a record written before capacity was a conf key: its reservation's capacity, else on-demand
    values.setdefault("capacity", default_capacity(values.get("reservation")))
    p = tpu_vm_pipeline_from_conf(values, dag_id=dag_id, run_id=run_id, require_reservation=machine == "tpu")
    vm = replace(p.cpu_vm if machine == "cpu" else p.vm, labels=tpu_vm.vm_labels(p, expires_at))
    if isinstance(vm, CpuVmSpec):
        return vm, tpu_vm.create_cpu_vm(vm, p.service_account)
    return vm, tpu_vm.create_vm(vm, p.service_account, boot_family=boot_family)


def boot_family_argument(value: str | None) -> str | None:
    """A ``boot_image_family`` argument: a baked image family (render/boot_image.py), or None."""
    if not value:
        return None
    try:
        return boot_image.check_family(str(value))
    except ValueError as err:
        raise SpecError("boot_image_family", str(err), value) from None


def create_run_vm(
    operator: GclusterBaseOperator, what: str, vm: TpuVmSpec | CpuVmSpec, command: Command
) -> None:
    """Run the VM's create; "already exists" is success only for a VM this run created (an
    earlier try): its labels name this DAG run; another's VM is a one-line ConfigurationError."""
    created = operator.hook.run_checked(command, timeout=stage_command_timeout("vm_create"))
    if not any(marker in created.output for marker in tpu_vm.VM_EXISTS):
        return
    described = operator.hook.run_checked(tpu_vm.describe_vm_labels(vm), log_output=False)
    labels = (parse_json_document(described.output_lines) or {}).get("labels") or {}
    mine = {key: vm.labels[key] for key in ("tpu-rl-dag", "tpu-rl-run")}
    theirs = {key: labels.get(key) for key in mine}
    if theirs != mine:
        raise ConfigurationError(
            f"{what} {vm.vm_name} already exists in {vm.zone} and this run did not create it "
            f"(its labels: tpu-rl-dag={theirs['tpu-rl-dag']}, tpu-rl-run={theirs['tpu-rl-run']}); "
            "choose another vm_name"
        )
    operator.log.info("%s %s already exists: created by an earlier try of this run, reused", what, vm.vm_name)


def refusal_line(err: CommandError) -> str:
    """The error's first line from gcloud's own ``ERROR:`` on (what an attempt's log line says)."""
    first = str(err).splitlines()[0].removesuffix("; last output:")
    said = first[first.index("ERROR:") :] if "ERROR:" in first else first
    return said if len(said) <= 300 else said[:297] + "..."


def attempt_conf(conf: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The create's conf for one kind of its ordered ``capacity``: the reservation only with
    ``reservation``."""
    return {**conf, "capacity": kind, "reservation": conf.get("reservation") if kind == RESERVATION else ""}


# The start a stage script's "following container" line gives (docker's .State.StartedAt: RFC 3339
# in UTC, nanoseconds).
_FOLLOWED_START = re.compile(
    r"\(started ([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]+))?Z\)"
)


def container_start(line: str) -> float | None:
    """Epoch seconds of the start a "following container" line gives; None without one."""
    match = _FOLLOWED_START.search(line)
    if match is None:
        return None
    began = datetime.strptime(match[1], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return began.timestamp() + float(f"0.{match[2] or 0}")


def container_failure(error: str) -> AirflowException | None:
    """A stage session's failure as its script's own line tells it: another run's running
    container refused (fatal), or a followed container's exit status lost (a retry looks again);
    None for any other failure."""
    for line in error.splitlines():
        text = line.strip()
        if text.startswith(tpu_vm.REFUSED_CONTAINER):
            return AirflowFailException(text.removeprefix(tpu_vm.REFUSED_CONTAINER).strip())
        if text.startswith(tpu_vm.UNSEEN_EXIT):
            return AirflowException(text.removeprefix(tpu_vm.UNSEEN_EXIT).strip())
    return None


class _TpuVmOperator(GclusterBaseOperator):
    """The arguments that name the VM.

    :param project_id: project of the VM; empty: the GCP connection's project.
    :param zone: zone of the VM (and its reservation).
    :param vm_name: the VM's name.
    :param bucket: the run's bucket (outputs are copied there; the janitor's record).
    :param model: the single-host model preset (``llama3.1-8b-Instruct``).
    """

    template_fields: Sequence[str] = (
        "project_id",
        "zone",
        "vm_name",
        "bucket",
        "model",
        "gcluster_conn_id",
        "gcp_conn_id",
        "impersonation_chain",
    )

    def __init__(
        self,
        *,
        zone: str,
        vm_name: str,
        bucket: str,
        model: str = DEFAULT_MODEL,
        project_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.project_id = project_id
        self.zone = zone
        self.vm_name = vm_name
        self.bucket = bucket
        self.model = model

    # Which of the run's VMs the operator works on: the TPU VM, or the CPU VM (``<vm_name>-cpu``).
    machine = "tpu"

    def conf(self) -> dict[str, Any]:
        """The VM's arguments as pipeline conf keys."""
        return {
            "project": self.resolve_project_id(),
            "zone": self.zone,
            "vm_name": self.vm_name,
            "bucket": self.bucket,
            "model": self.model,
        }

    def target_vm(self, p: TpuVmPipelineSpec) -> TpuVmSpec | CpuVmSpec:
        """The VM this operator works on."""
        return p.cpu_vm if self.machine == "cpu" else p.vm

    @property
    def what(self) -> str:
        return "CPU VM" if self.machine == "cpu" else "TPU VM"

    def spec(self, context: Context, **conf: Any) -> TpuVmPipelineSpec:
        dag_id, run_id = self.run_ids(context)
        return tpu_vm_pipeline_from_conf(
            {**self.conf(), "reservation": "", **conf},
            dag_id=dag_id,
            run_id=run_id,
            require_reservation=False,
        )


class TpuVmCreateOperator(_TpuVmOperator):
    """Create the TPU VM with labels the janitor reads; an existing VM of this run is reused.

    :param reservation: the v6e-8 reservation the VM is bound to (``reservation`` capacity).
    :param capacity: how the TPU VM is provisioned: ``on-demand``, ``reservation``, ``spot`` or
        ``flex-start`` (``render.tpu_vm.capacity_flags``), or an ordered list of them tried in
        turn (:meth:`create_falling_through`); empty: ``reservation`` when one is named, else
        ``on-demand``. Only ``reservation`` takes a reservation.
    :param service_account: the VM's service account; empty = the project's default.
    :param hf_token_conn_id: the HF token connection, which names the default secret.
    :param hf_token_secret: the secret the VM reads the token from; empty = the connection's.
    :param grant_service_account: grant the VM's service account (the named one or the
        project's default compute one) read access to the token secret and object access to
        the bucket, which the stages need.
    :param keep_vm: recorded for the janitor: a kept VM is only deleted at its expiry.
    :param max_vm_hours: the VM's expiry label, counted from the DAG run's start.
    :param boot_image_family: the TPU VM boots from this baked image family of its project (Docker
        and the workload image on its disk: ``TpuVmBootImageOperator``'s result); empty: from its
        own image family.
    """

    template_fields: Sequence[str] = (
        *_TpuVmOperator.template_fields,
        "reservation",
        "capacity",
        "service_account",
        "hf_token_conn_id",
        "hf_token_secret",
        "grant_service_account",
        "keep_vm",
        "max_vm_hours",
        "boot_image_family",
    )

    def __init__(
        self,
        *,
        reservation: str | None = None,
        capacity: str | list[str] | None = None,
        service_account: str | None = None,
        hf_token_conn_id: str = "huggingface_default",
        hf_token_secret: str | None = None,
        grant_service_account: bool | str = True,
        keep_vm: bool | str = False,
        max_vm_hours: int | str = 72,
        boot_image_family: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.boot_image_family = boot_image_family
        self.reservation = reservation
        self.capacity = capacity
        self.service_account = service_account
        self.hf_token_conn_id = hf_token_conn_id
        self.hf_token_secret = hf_token_secret
        self.grant_service_account = grant_service_account
        self.keep_vm = keep_vm
        self.max_vm_hours = max_vm_hours

    @fail_fast
    def execute(self, context: Context) -> str:
        dag_id, run_id = self.run_ids(context)
        conf = {
            **self.conf(),
            **self.machine_conf(),
            "reservation": self.reservation or "",
            "capacity": self.capacity or default_capacity(self.reservation),
            "service_account": self.service_account or None,
            "keep_vm": rules.boolean("keep_vm", self.keep_vm),
            "max_vm_hours": rules.integer("max_vm_hours", self.max_vm_hours, 1, 24 * 7),
        }
        grant = rules.boolean("grant_service_account", self.grant_service_account)
        boot_family = boot_family_argument(self.boot_image_family) if self.machine == "tpu" else None
        p = tpu_vm_pipeline_from_conf(
            {
                **conf,
                "hf_token_conn_id": self.hf_token_conn_id,
                "hf_token_secret": self.hf_token_secret or None,
            },
            dag_id=dag_id,
            run_id=run_id,
            require_reservation=self.machine == "tpu",
        )
        target = self.target_vm(p)
        expires_at = expiry_of_run(context, p.max_vm_hours)
        # The VM's lease first: a run that does not hold it never writes the record nor creates.
        try:
            lease = ClusterLeaseHook(self.gcp_conn_id, self.chain).acquire(
                target.bucket,
                vm_lease_name(target.vm_name),
                dag_id=dag_id,
                run_id=run_id,
                ttl=lease_ttl(expires_at),
            )
        except LeaseHeldError as err:
            raise AirflowFailException(str(err)) from None
        self.log.info(
            "%s %s: lease held by run %s until %s",
            self.what,
            target.vm_name,
            lease.holder,
            utc_text(lease.expires_at),
        )
        record = {
            "kind": "vm",
            "name": target.vm_name,
            "dag_id": dag_id,
            "run_id": run_id,
            "conf": conf,
            "boot_image_family": boot_family,
            "expires_at": expires_at,
            "keep": p.keep_vm,
            # the grants the VM holds (a retry of the create keeps them)
            **carried_grants(self.gcp_conn_id, target.bucket, target.vm_name, self.chain),
            # the kind an earlier try of this run's ordered capacity got (a retry tries it first)
            **(
                self.served_before(target, run_id)
                if isinstance(target, TpuVmSpec) and target.fallback
                else {}
            ),
        }
        write_resource_record(self.gcp_conn_id, target.bucket, target.vm_name, record, self.chain)
        if isinstance(target, TpuVmSpec) and target.fallback:
            served = record.get("capacity_served")
            kinds = [served, *(k for k in target.capacities if k != served)] if served else target.capacities
            vm: TpuVmSpec | CpuVmSpec = self.create_falling_through(
                context, conf, record, kinds, expires_at, boot_family
            )
        else:
            vm, command = vm_create_command(
                conf,
                dag_id=dag_id,
                run_id=run_id,
                machine=self.machine,
                expires_at=expires_at,
                boot_family=boot_family,
            )
            create_run_vm(self, self.what, vm, command)
        if self.machine == "tpu":
            billing.note_vm(self, vm)  # its billed time: from this start
        if grant:
            self.grant_vm_access(p)
        return vm.vm_name

    def served_before(self, target: TpuVmSpec, run_id: str) -> dict[str, Any]:
        """``capacity_served`` and ``capacity_attempts`` of an earlier try of this run whose create
        got a kind (its VM may exist: a retry tries that kind first, so "already exists" is the
        kind that served, and the kinds refused then stay recorded), else nothing."""
        earlier = read_resource_record(self.gcp_conn_id, target.bucket, target.vm_name, self.chain) or {}
        served = earlier.get("capacity_served")
        if earlier.get("run_id") == run_id and served in target.capacities:
            return {
                "capacity_served": str(served),
                "capacity_attempts": list(earlier.get("capacity_attempts") or []),
            }
        return {}

    def create_falling_through(
        self,
        context: Context,
        conf: Mapping[str, Any],
        record: Mapping[str, Any],
        kinds: Sequence[str],
        expires_at: int,
        boot_family: str | None,
    ) -> TpuVmSpec:
        """Create the TPU VM with the first of ``kinds`` the zone gives: a kind refused for lack of
        capacity (``capacity_refused``: stockout, quota, a full reservation) is one log line and
        the next is tried at once; any other failure stops as a one-kind create does. A refused
        create leaves no instance (Compute Engine fails the insert's operation). The kind that
        served goes into the resource record's conf (a train retry's re-create and the janitor
        take it) and into the ``capacity`` XCom with the refused attempts; all refused is one line
        listing each (a capacity failure: the task's retries may try again)."""
        dag_id, run_id = self.run_ids(context)
        attempts: list[dict[str, str]] = [dict(a) for a in record.get("capacity_attempts") or []]
        for kind in kinds:
            served = attempt_conf(conf, kind)
            vm, command = vm_create_command(
                served,
                dag_id=dag_id,
                run_id=run_id,
                machine="tpu",
                expires_at=expires_at,
                boot_family=boot_family,
            )
            try:
                create_run_vm(self, self.what, vm, command)
            except CommandError as err:
                if not capacity_refused(str(err)):
                    raise
                attempts.append({"capacity": kind, "error": refusal_line(err)})
                self.log.warning("Capacity %s refused: %s", kind, attempts[-1]["error"])
                continue
            assert isinstance(vm, TpuVmSpec)
            self.log.info(
                "Capacity %s: %s %s created after %d refused kind(s)",
                kind,
                self.what,
                vm.vm_name,
                len(attempts),
            )
            write_resource_record(
                self.gcp_conn_id,
                vm.bucket,
                vm.vm_name,
                {**record, "conf": served, "capacity_served": kind, "capacity_attempts": attempts},
                self.chain,
            )
            context["ti"].xcom_push(key=CAPACITY_XCOM, value={"served": kind, "attempts": attempts})
            return vm
        raise CommandError(
            f"{self.what} {conf['vm_name']}: no capacity kind could create it in {conf['zone']}: "
            + "; ".join(f"{a['capacity']}: {a['error']}" for a in attempts),
            FailureKind.CAPACITY,
        )

    def machine_conf(self) -> dict[str, Any]:
        """Conf keys only the CPU VM's create takes."""
        return {}

    def grant_vm_access(self, p: TpuVmPipelineSpec) -> str:
        """Let the VM's own service account read the token secret and write the bucket."""
        target = self.target_vm(p)
        result = self.hook.run_checked(tpu_vm.vm_service_account(target))
        # stdout and stderr come merged: the e-mail is the one line that is a service account
        accounts = [
            line.strip() for line in result.output_lines if rules.SERVICE_ACCOUNT.fullmatch(line.strip())
        ]
        if len(accounts) != 1:
            raise ConfigurationError(
                f"{self.what} {target.vm_name} reports no service account: its stages could not read "
                f"the HF token secret or write gs://{p.vm.bucket}; name one with service_account"
            )
        account = accounts[0]
        member = f"serviceAccount:{account}"
        bindings = [
            Binding("secret", p.vm.project, p.hf_token.secret_id, gke.SECRET_ACCESSOR, member),
            Binding("bucket", p.vm.project, p.vm.bucket, gke.STORAGE_OBJECT_ADMIN, member),
        ]
        # recorded in the VM's resource record and held for it: its delete takes back what it was
        # the last to hold (never a binding that existed before)
        added = RunGrants(self.hook, self.gcp_conn_id, self.chain).grant(
            target.bucket, target.vm_name, bindings
        )
        if added is None:  # no record to keep them in (a create without its record): granted only
            for command in tpu_vm.service_account_grants(
                p.vm.project, p.vm.bucket, p.hf_token.secret_id, account
            ):
                self.hook.run_checked(command)
        self.log.info(
            "Granted %s the HF token secret and object access to gs://%s (%s new: %s)",
            account,
            p.vm.bucket,
            self.what,
            ", ".join(b.text() for b in added or []) or "none",
        )
        return account


class CpuVmCreateOperator(TpuVmCreateOperator):
    """Create the run's CPU VM (``<vm_name>-cpu``), where the checkpoint conversions run: no TPU,
    no reservation; the same labels as the TPU VM, so the janitor deletes it at its expiry.

    Takes the arguments of :class:`TpuVmCreateOperator` (``reservation`` is not used), plus:

    :param cpu_machine_type: its machine type (a CPU one; default ``n2-highmem-32``, 256 GB).
    """

    template_fields: Sequence[str] = (*TpuVmCreateOperator.template_fields, "cpu_machine_type")
    machine = "cpu"

    def __init__(self, *, cpu_machine_type: str | None = None, reservation: str = "", **kwargs: Any) -> None:
        super().__init__(reservation=reservation, **kwargs)
        self.cpu_machine_type = cpu_machine_type

    def machine_conf(self) -> dict[str, Any]:
        return {"cpu_machine_type": self.cpu_machine_type} if self.cpu_machine_type else {}


def stage_lineage(p: TpuVmPipelineSpec, stage: str) -> Lineage | None:
    """What a TPU VM stage reads and writes (None: ``install`` moves no data)."""
    if stage == "convert":
        return conversion_lineage(p.conversion, machine=tpu_vm.stage_machine("convert"))
    if stage == "train":
        return training_lineage(p.training, tpu_vm.train_argv(p))
    if stage == "export":
        return export_lineage(p.export, machine=tpu_vm.stage_machine("export"), override_architecture=False)
    return None


class TpuVmStageOperator(LineageMixin, _TpuVmOperator):
    """Run one stage script (install, convert, train, export) on one of the run's VMs over SSH.

    Conversion and export run on the CPU VM, training on the TPU VM; every stage reads and writes
    GCS. A ``convert`` stage that finds or makes the converted checkpoint complete gives its
    ``outlets`` an asset event, as :class:`MaxTextConvertOperator` does (stable asset
    ``tpu-rl://converted-checkpoints/<preset>``, ``job_name`` null). With the OpenLineage provider, a finished convert, train or export stage reports what it
    read and wrote and its MaxText command (:mod:`airflow_provider_tpu_rl.lineage`).

    :param stage: ``install``, ``convert``, ``train`` or ``export``.
    :param on_machine: ``cpu`` or ``tpu``: the VM of an ``install`` (default the TPU VM); the
        other stages' VM is fixed and another one is refused.
    :param run_name: MaxText run name (the GCS folders of the checkpoint and export).
    :param num_batches: GRPO steps; empty = the preset's.
    :param train_overrides: extra MaxText overrides for training.
    :param hf_model_path: HF repo id to convert; empty = the preset's.
    :param hf_token_conn_id: the HF token connection, which names the default secret.
    :param hf_token_secret: the secret the VM reads the token from; empty = the connection's.
    :param recover_lost_vm: ``train`` only: a TPU VM lost under training (preempted: deleted or
        stopped by its termination action) fails the try as retryable, and the retry first brings
        it back: starts a stopped one, or re-creates a deleted one with the create task's argv (from
        its resource record; only the run holding its lease) and runs its install stage again (the
        image pulled, or MaxText installed); training then resumes from the newest committed
        checkpoint. Off: the retry trains on the VM as it is.
    :param runtime: how the VMs run MaxText: ``container`` (default: ``install`` prepares Docker
        and pulls ``workload_image`` (or, on a TPU VM booted from a baked image, checks it is
        there), every other stage runs in it) or ``install`` (MaxText installed from sources on
        both VMs, the tutorial's way): one MaxText release per run either way.
    :param workload_image: the image of runtime ``container``; empty = the post-training image.
    :param boot_image_family: ``install`` on the TPU VM: it booted from this baked image family
        (Docker and the workload image on its disk), so the stage only checks they are there.
    :param cancel_previous_writer: ``train``, ``export``, ``convert``: when the run directory's
        claim no longer vouches for its job (expired, or its run ended: a crashed worker) and that
        job still runs on its VM (the training container, a MaxText process), stop it and wait until
        nothing of it runs, then take the directory over. Off (default): fail in one line naming it
        and how to stop it. A claim of a live run is never taken over.
    :param previous_writer_stop_timeout: how long the stopped job may take to end (10 minutes).
    """

    template_fields: Sequence[str] = (
        *_TpuVmOperator.template_fields,
        "stage",
        "on_machine",
        "runtime",
        "workload_image",
        "boot_image_family",
        "run_name",
        "num_batches",
        "train_overrides",
        "hf_model_path",
        "hf_token_conn_id",
        "hf_token_secret",
        "recover_lost_vm",
        "cancel_previous_writer",
    )

    def __init__(
        self,
        *,
        stage: str,
        on_machine: str | None = None,
        run_name: str | None = None,
        num_batches: int | str | None = None,
        train_overrides: Mapping[str, Any] | None = None,
        hf_model_path: str | None = None,
        hf_token_conn_id: str = "huggingface_default",
        hf_token_secret: str | None = None,
        recover_lost_vm: bool | str = True,
        runtime: str = "container",
        workload_image: str | None = None,
        boot_image_family: str | None = None,
        cancel_previous_writer: bool | str = False,
        previous_writer_stop_timeout: timedelta = DEFAULT_STOP_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cancel_previous_writer = cancel_previous_writer
        self.previous_writer_stop_timeout = previous_writer_stop_timeout
        self._killed = False
        self.recover_lost_vm = recover_lost_vm
        self.stage = stage
        self.on_machine = on_machine
        self.runtime = runtime
        self.workload_image = workload_image
        self.boot_image_family = boot_image_family
        self.run_name = run_name
        self.num_batches = num_batches
        self.train_overrides = train_overrides
        self.hf_model_path = hf_model_path
        self.hf_token_conn_id = hf_token_conn_id
        self.hf_token_secret = hf_token_secret

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        if self.stage not in tpu_vm.STAGES:
            raise SpecError("stage", f"must be one of {list(tpu_vm.STAGES)}", self.stage)
        try:
            machine = tpu_vm.stage_machine(self.stage, self.on_machine or None)
        except ValueError as err:
            raise SpecError("on_machine", str(err), str(self.on_machine)) from None
        p = self.spec(
            context,
            run_name=self.run_name or None,
            num_batches=None
            if self.num_batches in (None, "")
            else rules.integer("num_batches", self.num_batches, 1),
            train_overrides=self.train_overrides or {},
            hf_model_path=self.hf_model_path or None,
            hf_token_conn_id=self.hf_token_conn_id,
            hf_token_secret=self.hf_token_secret or None,
            **({"runtime": self.runtime} if self.runtime else {}),
            workload_image=self.workload_image or None,
        )
        self._lineage = stage_lineage(p, self.stage)
        tracker = TrainingLogTracker()
        total = p.training.final_step
        followed: list[float] = []  # the start of an earlier try's container the session follows

        def on_line(line: str) -> None:
            if line.startswith(tpu_vm.FOLLOWING_CONTAINER):
                followed.append(container_start(line) or time.time())
                self.log.warning("%s", line)
            if self.stage != "train":
                return
            before = tracker.last_step
            tracker.feed(line)
            if tracker.last_step is not None and tracker.last_step != before:
                self.log.info("progress: %s", tracker.progress_text(total))

        vm = p.cpu_vm if machine == "cpu" else p.vm
        out: dict[str, Any] = {"stage": self.stage, "vm_name": vm.vm_name, "machine": machine}
        if machine == "tpu":
            out["runtime"] = p.runtime
        run = "/".join(self.run_ids(context))
        directory = self.output_directory(p)
        done = self.completed_output(p, directory, run) if directory is not None else None
        if done is not None:
            out |= done
        else:
            recover = self.stage == "train" and rules.boolean("recover_lost_vm", self.recover_lost_vm)
            if recover and context["ti"].try_number > 1:
                self.bring_back_vm(context, p)
            if directory is not None:
                self.claim_output(context, p, directory, run)
            started = time.time()
            ended = False  # the stage's session ran to its end (else its job may still run)
            try:
                with self.claim_renewed(p, directory, run):
                    try:
                        # One SSH session runs the whole stage: it gets the stage's bound, not a short call's.
                        self.hook.run_checked(
                            tpu_vm.stage_command(
                                p,
                                self.stage,
                                machine=machine,
                                ssh_key_file=str(self.hook.ssh_key_file()),
                                boot_family=boot_family_argument(self.boot_image_family),
                            ),
                            on_line=on_line,
                            timeout=stage_command_timeout(self.stage),
                        )
                    except CommandError as err:
                        told = container_failure(str(err))
                        if told is not None:
                            raise told from None
                        lost = self.lost_vm_status(p.vm) if self.stage == "train" else None
                        if lost is None:
                            raise  # not a lost VM: classified as any failed command
                        raise AirflowException(self.lost_vm_message(p, lost, recover)) from None
                ended = True
            finally:
                if directory is not None and (ended or not self.still_writing(p, directory, run)):
                    attempt = None
                    if self.stage == "train":  # what this session trained, for the next one's resume
                        # a followed container's attempt began at its start, not this session's
                        span = {"started_at": followed[0] if followed else started, "ended_at": time.time()}
                        attempt = attempt_from_log(run, self.stage_job(p), tracker.metrics(), span)
                    record = self.release_output(p, directory, run, attempt)
                    if record is not None and record.attempts:
                        out["attempts"] = [each.as_dict() for each in record.attempts]
        if self.stage == "train":
            metrics, evaluated = tracker.metrics(), p.training.num_test_batches
            out |= {
                "metrics": metrics,
                NUM_TEST_BATCHES_METRIC: evaluated,
                "checkpoint_uri": p.gcs_actor_checkpoint + "/model_params/",
            }
            if done is None:  # a stage that ran now (a completed one was trained by an earlier try)
                self.log.info("Training: %s", reward_summary(metrics, evaluated))
        if self.stage == "export":
            out["export_uri"] = p.gcs_export + "/"
        if self.stage == "convert":
            self.emit_converted(context, p, reused=done is not None)
        return out

    def emit_converted(self, context: Context, p: TpuVmPipelineSpec, *, reused: bool) -> None:
        """The ``convert`` stage's asset events: the preset's converted checkpoint, complete."""
        dag_id, run_id = self.run_ids(context)
        extra = {
            "run_id": f"{dag_id}/{run_id}",
            "dag_id": dag_id,
            "airflow_run_id": run_id,
            "model": str(self.model),
            "base_model": base_model_facts(str(self.model), p.conversion.hf_model_path).hub_id,
            "checkpoint_uri": run_dir(p.conversion.output_directory),
            "parameters_uri": p.training.load_parameters_path,
            "job_name": None,
            "reused": reused,
            "maxtext_release": p.preset.maxtext_version,
        }
        uri = converted_checkpoint_asset_uri(str(self.model))
        for line in emit_asset_events(context, self.outlets or (), uri, extra):
            self.log.info("Asset event: %s", line)
        leave_converted_event(context, extra)

    def still_writing(self, p: TpuVmPipelineSpec, directory: str, run: str) -> bool:
        """After a session that did not end (killed, dropped, failed): whether the stage's job
        still writes ``directory`` on its VM. The training container outlives its SSH session (its
        docker client's end does not stop it): then the claim is kept, never released under a
        running writer (it expires unrenewed, and a takeover must prove the job dead). A task
        killed by Airflow (``on_kill``) stops its own job first, as a GKE job is cancelled."""
        own = WriterClaim(
            run, self.stage_job(p), f"{p.vm.project}/{p.vm.zone}/{self.stage_vm(p).vm_name}", 0.0, VM
        )
        writer = VmWriter(own, self.hook, directory)
        try:
            state = (
                writer.stop(self.previous_writer_stop_timeout.total_seconds())
                if self._killed
                else writer.state()
            )
        except Exception as err:  # unknown: keep the claim, it expires on its own
            self.log.warning(
                "Could not tell whether the %s stage still runs on %s: %s", self.stage, own.where, err
            )
            return True
        if state.gone:
            return False
        self.log.warning(
            "The %s stage's session ended but its job may still write %s (%s): its claim is kept "
            "until it expires; a run taking the directory over must prove it dead",
            self.stage,
            directory,
            state.detail,
        )
        return True

    def on_kill(self) -> None:
        self._killed = True  # the stage's own job is stopped before its claim is released
        super().on_kill()

    # -- a TPU VM lost under training (preempted) ---------------------------------------------
    def lost_vm_status(self, vm: TpuVmSpec) -> str | None:
        """How the VM is lost (``TERMINATED``, ... or ``DELETED`` when it is gone), None when it is
        not (running, or its status cannot be read)."""
        described = self.hook.run(tpu_vm.describe_vm_status(vm), log_output=False)
        if not described.ok:
            return "DELETED" if any(m in described.output for m in tpu_vm.VM_GONE) else None
        status = described.output.strip().splitlines()[-1:] or [""]
        return status[0] if status[0] in tpu_vm.VM_LOST_STATUSES else None

    def lost_vm_message(self, p: TpuVmPipelineSpec, status: str, recover: bool) -> str:
        """The one line a try whose TPU VM was lost fails with (retryable)."""
        from airflow_provider_tpu_rl.operators.gke_jobs import newest_committed_step

        step = newest_committed_step(self.gcp_conn_id, p.gcs_actor_checkpoint_root, self.chain)
        resume = f"step {step}" if step is not None else "none committed: from the start"
        if not recover:
            return (
                f"TPU VM {p.vm.vm_name} was lost under training (status {status}); recover_lost_vm is "
                f"off: once it is back, a retry resumes from the newest committed checkpoint ({resume})"
            )
        return (
            f"TPU VM {p.vm.vm_name} was lost under training (status {status}); the retry brings it back "
            f"and resumes from the newest committed checkpoint ({resume})"
        )

    def bring_back_vm(self, context: Context, p: TpuVmPipelineSpec) -> None:
        """Before a retry trains: start the TPU VM if it is stopped; re-create it if it is gone (as
        the create task did, for the run holding its lease) and install MaxText on it.

        A stopped VM whose start is refused is deleted and re-created the same way: Cloud TPU's
        spot page (docs.cloud.google.com/tpu/docs/spot) says "You can't restart TPU Spot VMs, and
        you must recreate them after preemption", while Compute Engine's spot page lets a stopped
        Spot VM start again; which of the two holds for a ct6e instance is not stated, so the start
        is tried first (it keeps the boot disk) and its refusal is not fatal.
        """
        status = self.lost_vm_status(p.vm)
        if status is None:
            return
        if status not in ("DELETED", "TERMINATED"):
            raise AirflowException(
                f"TPU VM {p.vm.vm_name} is {status}: only a stopped (TERMINATED) or deleted one is "
                "brought back; the next try looks again"
            )
        if status == "TERMINATED":
            self.log.info("TPU VM %s was stopped under training: starting it", p.vm.vm_name)
            started = self.hook.run(tpu_vm.start_vm(p.vm), timeout=stage_command_timeout("vm_create"))
            if started.ok:
                billing.note_vm(self, p.vm)  # its second billed span: from this start
                return
            refusal = error_line(started.output)
            record = self.owned_vm_record(context, p, f"cannot be started ({refusal}) and")
            self.log.warning(
                "TPU VM %s cannot be started again (%s): deleting it and re-creating it as create_vm did",
                p.vm.vm_name,
                refusal,
            )
            self.hook.run_checked(tpu_vm.delete_vm(p.vm), timeout=stage_command_timeout("teardown"))
        else:
            record = self.owned_vm_record(context, p, "is gone and")
            self.log.warning(
                "TPU VM %s was deleted under training: re-creating it as create_vm did", p.vm.vm_name
            )
        dag_id, run_id = self.run_ids(context)
        boot_family = boot_family_argument(record.get("boot_image_family"))
        vm, command = vm_create_command(
            record["conf"],
            dag_id=dag_id,
            run_id=run_id,
            machine="tpu",
            expires_at=int(record["expires_at"]),
            boot_family=boot_family,
        )
        create_run_vm(self, "TPU VM", vm, command)
        billing.note_vm(self, vm)  # a new incarnation, billed from this start
        self.hook.run_checked(
            tpu_vm.stage_command(
                p,
                "install",
                machine="tpu",
                ssh_key_file=str(self.hook.ssh_key_file()),
                boot_family=boot_family,
            ),
            timeout=stage_command_timeout("install"),
        )

    def owned_vm_record(self, context: Context, p: TpuVmPipelineSpec, state: str) -> dict[str, Any]:
        """The TPU VM's resource record, once this run is proven its owner (it holds the VM's lease
        and the record names it): only then is the VM deleted or re-created. ``state`` says what
        happened to the VM, for the line refusing otherwise."""
        dag_id, run_id = self.run_ids(context)
        holder = f"{dag_id}/{run_id}"
        lease = ClusterLeaseHook(self.gcp_conn_id, self.chain).read(p.vm.bucket, vm_lease_name(p.vm.vm_name))
        record = read_resource_record(self.gcp_conn_id, p.vm.bucket, p.vm.vm_name, self.chain)
        if lease is None or lease.holder != holder:
            raise AirflowFailException(
                f"TPU VM {p.vm.vm_name} {state} this run does not hold its lease "
                f"({held_message(lease) if lease else 'nobody does'}): it is not re-created"
            )
        if record is None or f"{record.get('dag_id')}/{record.get('run_id')}" != holder:
            raise AirflowFailException(
                f"TPU VM {p.vm.vm_name} {state} its resource record does not name this run: "
                "it is not re-created"
            )
        return record

    # -- the run directory this stage writes in GCS (train, export) ------------------------------
    def output_directory(self, p: TpuVmPipelineSpec) -> str | None:
        """The GCS folder the stage writes: the model's converted checkpoint, the run's for
        training, its export's."""
        return tpu_vm.stage_output_directory(p, self.stage)

    def _ready(self, p: TpuVmPipelineSpec) -> dict[str, Any] | None:
        from airflow_provider_tpu_rl.operators.gke_jobs import checkpoint_ready, export_ready

        if self.stage == "convert":
            return checkpoint_ready(
                self.gcp_conn_id,
                p.conversion.output_directory,
                CONVERTED_CHECKPOINT_STEP,
                CONVERTED_CHECKPOINT_ITEMS,
                self.chain,
            )
        if self.stage == "train":
            return checkpoint_ready(
                self.gcp_conn_id,
                p.gcs_actor_checkpoint_root,
                p.training.final_step,
                ("model_params",),
                self.chain,
            )
        return export_ready(self.gcp_conn_id, p.gcs_export + "/", self.chain)

    def completed_output(self, p: TpuVmPipelineSpec, directory: str, run: str) -> dict[str, Any] | None:
        """The result when the stage's output is already complete: this run's (a retry) is skipped;
        another run's, under a reused run_name, is adopted as a resume and said so — never written
        over (an export never overwrites another run's export)."""
        if self._ready(p) is None:
            return None
        if self.stage == "convert":
            # A converted checkpoint depends only on the model: any run reuses a complete one.
            self.log.info("%s is already complete: the conversion is skipped", directory)
            return {"skipped": True, "resumed_from": None}
        records = RunDirRecords(self.gcp_conn_id, self.chain)
        record = records.read(p.vm.bucket, directory)
        if record.owner in (None, run):
            self.log.info(
                "%s is already complete (written by this run): the %s stage is skipped", directory, self.stage
            )
            return {"skipped": True, "resumed_from": None}
        claimed = records.claim(p.vm.bucket, directory, run=run, settings={}, writer=None)
        previous = claimed.before(run) or "(a run not recorded)"
        self.log.warning(
            "Resuming %s: it is already complete, written by run %s; this run adopts it "
            "(resumed_from=%s), nothing is written over it",
            directory,
            previous,
            previous,
        )
        return {"skipped": True, "resumed_from": previous}

    def claim_output(self, context: Context, p: TpuVmPipelineSpec, directory: str, run: str) -> None:
        """One writer per directory: claim it for this stage, or fail in one line. A claim that no
        longer vouches for its job (expired, or its run ended) is taken over only once that job is
        proven dead where it runs (:mod:`~airflow_provider_tpu_rl.operators.takeover`)."""
        from airflow_provider_tpu_rl.operators.gke_jobs import claim_seconds
        from airflow_provider_tpu_rl.records.janitor_sources import run_finished, run_probe

        probe = run_probe(context)
        records = RunDirRecords(self.gcp_conn_id, self.chain)
        for _ in range(3):  # the record changed between the proof and the write: decide again
            held = records.read(p.vm.bucket, directory).writer
            takeover, displaced = None, None
            if held is not None and held.run != run:
                finished = run_finished(probe, held.run)
                if not vouches(held, finished):
                    state = prove_dead(
                        self,
                        held,
                        directory,
                        finished=finished,
                        stage=self.stage,
                        cancel=rules.boolean("cancel_previous_writer", self.cancel_previous_writer),
                        pathways=False,
                        stop_timeout=self.previous_writer_stop_timeout,
                        claim_seconds=claim_seconds(),
                    )
                    takeover = held
                    displaced = displaced_attempt(held, state, None) if self.stage == "train" else None
            writer = WriterClaim(
                run,
                self.stage_job(p),
                f"{p.vm.project}/{p.vm.zone}/{self.stage_vm(p).vm_name}",
                time.time() + claim_seconds(),
                VM,
            )
            try:
                claimed = records.claim(
                    p.vm.bucket,
                    directory,
                    run=run,
                    settings={},
                    writer=writer,
                    takeover=takeover,
                    displaced=displaced,
                )
            except RunDirBusyError as busy:
                if takeover is None and busy.writer == held:
                    raise AirflowFailException(str(busy)) from None
                continue
            break
        else:
            raise AirflowFailException(f"the record of {directory} keeps changing: another run claims it")
        if takeover is not None:
            self.log.warning(
                "Took %s over from %s of run %s (%s)", directory, takeover.job, takeover.run, takeover.where
            )
        elif claimed.before(run):
            self.log.warning(
                "Resuming %s, started by run %s (no longer writing it)", directory, claimed.before(run)
            )

    def claim_renewed(
        self, p: TpuVmPipelineSpec, directory: str | None, run: str
    ) -> AbstractContextManager[None]:
        """The stage's writer claim renewed while its SSH session runs (nothing without one)."""
        if directory is None:
            return contextlib.nullcontext()
        from airflow_provider_tpu_rl.operators.gke_jobs import claim_seconds

        return claim_kept_alive(
            RunDirRecords(self.gcp_conn_id, self.chain),
            p.vm.bucket,
            directory,
            run=run,
            job=self.stage_job(p),
            seconds=claim_seconds(),
        )

    def stage_vm(self, p: TpuVmPipelineSpec) -> TpuVmSpec | CpuVmSpec:
        return p.cpu_vm if tpu_vm.stage_machine(self.stage, self.on_machine or None) == "cpu" else p.vm

    def stage_job(self, p: TpuVmPipelineSpec) -> str:
        """The stage's name in its run directory's claim: ``<vm_name>/<stage>``."""
        return f"{self.stage_vm(p).vm_name}/{self.stage}"

    def release_output(
        self, p: TpuVmPipelineSpec, directory: str, run: str, attempt: TrainingAttempt | None = None
    ) -> RunDirRecord | None:
        """The stage ended: its claim goes, with the training ``attempt`` it made; the record
        (None when it could not be written: the claim expires on its own)."""
        try:
            return RunDirRecords(self.gcp_conn_id, self.chain).release(
                p.vm.bucket, directory, run=run, attempt=attempt
            )
        except Exception as err:  # the claim expires on its own
            self.log.warning("Could not release the claim on %s: %s", directory, err)
            return None


class TpuVmDeleteOperator(_TpuVmOperator):
    """Delete the VM (an absent VM is success) unless ``keep_vm``; the bucket only if asked.

    Only a VM this run holds the lease of is deleted (or, with no lease at all, one whose resource
    record says this run created it): a run that never got the VM, or found it in use by another
    run, leaves it alone. The lease is released at the end (with ``keep_vm``: marked kept). Once
    the VM is deleted, the grants its resource record lists are let go of (``records/grants.py``:
    each removed when the VM was its last holder and it did not exist before).

    :param keep_vm: leave the VM running (it bills until its expiry).
    :param delete_bucket: also delete the bucket, **with every checkpoint and export in it**.
    """

    template_fields: Sequence[str] = (*_TpuVmOperator.template_fields, "keep_vm", "delete_bucket")

    def __init__(
        self, *, keep_vm: bool | str = False, delete_bucket: bool | str = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.keep_vm = keep_vm
        self.delete_bucket = delete_bucket

    def owns_vm(self, p: TpuVmPipelineSpec, lease: Lease | None, holder: str) -> bool:
        """Whether this run may delete the VM."""
        if lease is not None:
            if lease.holder == holder:
                return True
            self.log.warning("%s: this run does not hold its lease and leaves it alone", held_message(lease))
            return False
        vm = self.target_vm(p)
        record = read_resource_record(self.gcp_conn_id, vm.bucket, vm.vm_name, self.chain)
        if record is not None and f"{record.get('dag_id')}/{record.get('run_id')}" == holder:
            return True
        self.log.warning(
            "%s %s: nobody holds its lease and this run did not create it (record: %s): left alone",
            self.what,
            vm.vm_name,
            f"run {record.get('dag_id')}/{record.get('run_id')}" if record else "none",
        )
        return False

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        p = self.spec(context)
        keep, delete_bucket = (
            rules.boolean("keep_vm", self.keep_vm),
            rules.boolean("delete_bucket", self.delete_bucket),
        )
        deleted = False
        removed: list[Binding] = []
        dag_id, run_id = self.run_ids(context)
        leases = ClusterLeaseHook(self.gcp_conn_id, self.chain)
        vm = self.target_vm(p)
        lease = leases.read(vm.bucket, vm_lease_name(vm.vm_name))
        owned = self.owns_vm(p, lease, f"{dag_id}/{run_id}")
        billed = owned and self.machine == "tpu"  # the TPU VM's clocks, for the ledger
        if billed:
            billing.note_vm(self, vm)  # a start not noted yet (a create whose note failed)
        if not owned:
            pass
        elif keep:
            self.log.warning("keep_vm=true: %s %s is left running (it bills)", self.what, vm.vm_name)
            if lease is not None:
                leases.release(vm.bucket, lease, keep=True)
        else:
            self.hook.run_checked(tpu_vm.delete_vm(vm), timeout=stage_command_timeout("teardown"))
            deleted = True
            removed = RunGrants(self.hook, self.gcp_conn_id, self.chain).release(vm.bucket, vm.vm_name)
            if lease is not None:
                leases.release(vm.bucket, lease)
        result: dict[str, Any] = {
            "vm_name": vm.vm_name,
            "deleted": deleted,
            "bucket_deleted": False,
            "removed_grants": [b.text() for b in removed],
        }
        if billed:
            result[billing.XCOM_KEY] = billing.vm_billed(self, vm)
        if delete_bucket:
            result |= delete_run_bucket(self, context, p.vm.bucket)
        return result


class CpuVmDeleteOperator(TpuVmDeleteOperator):
    """Delete the run's CPU VM (``<vm_name>-cpu``), as :class:`TpuVmDeleteOperator` the TPU VM:
    the pipeline's last teardown, which also owns ``delete_bucket``."""

    machine = "cpu"
