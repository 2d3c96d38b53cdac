"""Single-host pipeline (seed 002): one reservation-bound v6e-8 TPU VM driven over SSH."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from airflow.providers.common.compat.sdk import Context

from airflow_provider_tpu_rl.maxtext.logs import TrainingLogTracker
from airflow_provider_tpu_rl.operators.gke import write_resource_record
from airflow_provider_tpu_rl.operators.pipeline import PipelineOperator, run_expiry
from airflow_provider_tpu_rl.render import gke, tpu_vm
from airflow_provider_tpu_rl.spec import TpuVmPipelineSpec


class _TpuVmOperator(PipelineOperator):
    pipeline_kind = "tpu_vm"


class TpuVmCreateOperator(_TpuVmOperator):
    """Create the TPU VM with labels the janitor reads; an existing VM of this run is reused."""

    def execute(self, context: Context) -> str:
        p: TpuVmPipelineSpec = self.pipeline(context)
        expires_at = run_expiry(context, p.max_vm_hours)
        write_resource_record(
            self.gcp_conn_id,
            p.vm.bucket,
            p.vm.vm_name,
            kind="vm",
            context=context,
            conf=self.pipeline_conf_for(context),
            expires_at=expires_at,
            keep=p.keep_vm,
        )
        vm = replace(p.vm, labels=tpu_vm.vm_labels(p, expires_at))
        self.hook.run_checked(tpu_vm.create_vm(vm, p.service_account))
        return vm.vm_name


class TpuVmStageOperator(_TpuVmOperator):
    """Run one stage script (install, convert, train, export) on the VM over SSH.

    The train and export stages copy their outputs out of /dev/shm to GCS before they return.
    """

    template_fields: Sequence[str] = (*PipelineOperator.template_fields, "stage")

    def __init__(self, *, stage: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if stage not in tpu_vm.STAGES:
            raise ValueError(f"stage must be one of {tpu_vm.STAGES}, got {stage!r}")
        self.stage = stage

    def execute(self, context: Context) -> dict[str, Any]:
        p: TpuVmPipelineSpec = self.pipeline(context)
        tracker = TrainingLogTracker()
        total = p.training.final_step

        def on_line(line: str) -> None:
            before = tracker.last_step
            tracker.feed(line)
            if tracker.last_step is not None and tracker.last_step != before:
                self.log.info("progress: %s", tracker.progress_text(total))

        self.hook.run_checked(
            tpu_vm.stage_command(p, self.stage), on_line=on_line if self.stage == "train" else None
        )
        out: dict[str, Any] = {"stage": self.stage, "vm_name": p.vm.vm_name}
        if self.stage == "train":
            out |= {"metrics": tracker.metrics(), "checkpoint_uri": p.gcs_actor_checkpoint + "/model_params/"}
        if self.stage == "export":
            out["export_uri"] = p.gcs_export + "/"
        return out


class TpuVmDeleteOperator(_TpuVmOperator):
    """Delete the VM (an absent VM is success) unless ``keep_vm``; the bucket only if asked."""

    def execute(self, context: Context) -> dict[str, Any]:
        p: TpuVmPipelineSpec = self.pipeline(context)
        deleted = False
        if p.keep_vm:
            self.log.warning("keep_vm=true: TPU VM %s is left running (it bills)", p.vm.vm_name)
        else:
            self.hook.run_checked(tpu_vm.delete_vm(p.vm))
            deleted = True
        if p.delete_bucket:
            self.log.warning("delete_bucket=true: deleting gs://%s and every checkpoint in it", p.vm.bucket)
            self.hook.run_checked(gke.delete_bucket(p.vm.bucket))
        return {"vm_name": p.vm.vm_name, "deleted": deleted, "bucket_deleted": p.delete_bucket}
