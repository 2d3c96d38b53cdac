"""Single-host pipeline (seed 002): one reservation-bound v6e-8 TPU VM driven over SSH."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from airflow.providers.common.compat.sdk import Context

from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.maxtext.logs import TrainingLogTracker
from airflow_provider_tpu_rl.operators.base import GclusterBaseOperator, expiry_of_run, fail_fast
from airflow_provider_tpu_rl.operators.gke import write_resource_record
from airflow_provider_tpu_rl.render import gke, tpu_vm
from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.pipeline import (
    TPU_VM_DEFAULTS,
    TpuVmPipelineSpec,
    tpu_vm_pipeline_from_conf,
)
from airflow_provider_tpu_rl.timeouts import stage_command_timeout

DEFAULT_MODEL = str(TPU_VM_DEFAULTS["model"])


class _TpuVmOperator(GclusterBaseOperator):
    """The arguments that name the VM.

    :param project_id: project of the VM.
    :param zone: zone of the VM (and its reservation).
    :param vm_name: the VM's name.
    :param bucket: the run's bucket (outputs are copied there; the janitor's record).
    :param model: the single-host model preset (``llama3.1-8b-Instruct``).
    """

    template_fields: Sequence[str] = ("project_id", "zone", "vm_name", "bucket", "model", "gcluster_conn_id")

    def __init__(
        self,
        *,
        project_id: str,
        zone: str,
        vm_name: str,
        bucket: str,
        model: str = DEFAULT_MODEL,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.project_id = project_id
        self.zone = zone
        self.vm_name = vm_name
        self.bucket = bucket
        self.model = model

    def conf(self) -> dict[str, Any]:
        """The VM's arguments as pipeline conf keys."""
        return {
            "project": self.project_id,
            "zone": self.zone,
            "vm_name": self.vm_name,
            "bucket": self.bucket,
            "model": self.model,
        }

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

    :param reservation: the v6e-8 reservation the VM is bound to.
    :param service_account: the VM's service account; empty = the project's default.
    :param hf_token_conn_id: the HF token connection, which names the default secret.
    :param hf_token_secret: the secret the VM reads the token from; empty = the connection's.
    :param grant_service_account: grant the VM's service account (the named one or the
        project's default compute one) read access to the token secret and object access to
        the bucket, which the stages need.
    :param keep_vm: recorded for the janitor: a kept VM is only deleted at its expiry.
    :param max_vm_hours: the VM's expiry label, counted from the DAG run's start.
    """

    template_fields: Sequence[str] = (
        *_TpuVmOperator.template_fields,
        "reservation",
        "service_account",
        "hf_token_conn_id",
        "hf_token_secret",
        "grant_service_account",
        "keep_vm",
        "max_vm_hours",
        "gcp_conn_id",
    )

    def __init__(
        self,
        *,
        reservation: str,
        service_account: str | None = None,
        hf_token_conn_id: str = "huggingface_default",
        hf_token_secret: str | None = None,
        grant_service_account: bool | str = True,
        keep_vm: bool | str = False,
        max_vm_hours: int | str = 72,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.reservation = reservation
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
            "reservation": self.reservation,
            "service_account": self.service_account or None,
            "keep_vm": rules.boolean("keep_vm", self.keep_vm),
            "max_vm_hours": rules.integer("max_vm_hours", self.max_vm_hours, 1, 24 * 7),
        }
        grant = rules.boolean("grant_service_account", self.grant_service_account)
        p = tpu_vm_pipeline_from_conf(
            {
                **conf,
                "hf_token_conn_id": self.hf_token_conn_id,
                "hf_token_secret": self.hf_token_secret or None,
            },
            dag_id=dag_id,
            run_id=run_id,
        )
        expires_at = expiry_of_run(context, p.max_vm_hours)
        write_resource_record(
            self.gcp_conn_id,
            p.vm.bucket,
            p.vm.vm_name,
            {
                "kind": "vm",
                "name": p.vm.vm_name,
                "dag_id": dag_id,
                "run_id": run_id,
                "conf": conf,
                "expires_at": expires_at,
                "keep": p.keep_vm,
            },
        )
        vm = replace(p.vm, labels=tpu_vm.vm_labels(p, expires_at))
        self.hook.run_checked(
            tpu_vm.create_vm(vm, p.service_account), timeout=stage_command_timeout("vm_create")
        )
        if grant:
            self.grant_vm_access(p)
        return vm.vm_name

    def grant_vm_access(self, p: TpuVmPipelineSpec) -> str:
        """Let the VM's own service account read the token secret and write the bucket."""
        result = self.hook.run_checked(tpu_vm.vm_service_account(p.vm))
        # stdout and stderr come merged: the e-mail is the one line that is a service account
        accounts = [
            line.strip() for line in result.output_lines if rules.SERVICE_ACCOUNT.fullmatch(line.strip())
        ]
        if len(accounts) != 1:
            raise ConfigurationError(
                f"TPU VM {p.vm.vm_name} reports no service account: its stages could not read "
                f"the HF token secret or write gs://{p.vm.bucket}; name one with service_account"
            )
        account = accounts[0]
        for command in tpu_vm.service_account_grants(
            p.vm.project, p.vm.bucket, p.hf_token.secret_id, account
        ):
            self.hook.run_checked(command)
        self.log.info("Granted %s the HF token secret and object access to gs://%s", account, p.vm.bucket)
        return account


class TpuVmStageOperator(_TpuVmOperator):
    """Run one stage script (install, convert, train, export) on the VM over SSH.

    The train and export stages copy their outputs out of /dev/shm to GCS before they return.

    :param stage: ``install``, ``convert``, ``train`` or ``export``.
    :param run_name: MaxText run name (the GCS folders of the checkpoint and export).
    :param num_batches: GRPO steps; empty = the preset's.
    :param train_overrides: extra MaxText overrides for training.
    :param hf_model_path: HF repo id to convert; empty = the preset's.
    :param hf_token_conn_id: the HF token connection, which names the default secret.
    :param hf_token_secret: the secret the VM reads the token from; empty = the connection's.
    """

    template_fields: Sequence[str] = (
        *_TpuVmOperator.template_fields,
        "stage",
        "run_name",
        "num_batches",
        "train_overrides",
        "hf_model_path",
        "hf_token_conn_id",
        "hf_token_secret",
    )

    def __init__(
        self,
        *,
        stage: str,
        run_name: str | None = None,
        num_batches: int | str | None = None,
        train_overrides: Mapping[str, Any] | None = None,
        hf_model_path: str | None = None,
        hf_token_conn_id: str = "huggingface_default",
        hf_token_secret: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stage = stage
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
        )
        tracker = TrainingLogTracker()
        total = p.training.final_step

        def on_line(line: str) -> None:
            before = tracker.last_step
            tracker.feed(line)
            if tracker.last_step is not None and tracker.last_step != before:
                self.log.info("progress: %s", tracker.progress_text(total))

        # One SSH session runs the whole stage: it gets the stage's bound, not a short call's.
        self.hook.run_checked(
            tpu_vm.stage_command(p, self.stage, ssh_key_file=str(self.hook.ssh_key_file())),
            on_line=on_line if self.stage == "train" else None,
            timeout=stage_command_timeout(self.stage),
        )
        out: dict[str, Any] = {"stage": self.stage, "vm_name": p.vm.vm_name}
        if self.stage == "train":
            out |= {"metrics": tracker.metrics(), "checkpoint_uri": p.gcs_actor_checkpoint + "/model_params/"}
        if self.stage == "export":
            out["export_uri"] = p.gcs_export + "/"
        return out


class TpuVmDeleteOperator(_TpuVmOperator):
    """Delete the VM (an absent VM is success) unless ``keep_vm``; the bucket only if asked.

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

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        p = self.spec(context)
        keep, delete_bucket = (
            rules.boolean("keep_vm", self.keep_vm),
            rules.boolean("delete_bucket", self.delete_bucket),
        )
        deleted = False
        if keep:
            self.log.warning("keep_vm=true: TPU VM %s is left running (it bills)", p.vm.vm_name)
        else:
            self.hook.run_checked(tpu_vm.delete_vm(p.vm), timeout=stage_command_timeout("teardown"))
            deleted = True
        if delete_bucket:
            self.log.warning("delete_bucket=true: deleting gs://%s and every checkpoint in it", p.vm.bucket)
            self.hook.run_checked(gke.delete_bucket(p.vm.bucket))
        return {"vm_name": p.vm.vm_name, "deleted": deleted, "bucket_deleted": delete_bucket}
