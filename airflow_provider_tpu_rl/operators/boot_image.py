"""The TPU VM's baked boot image (``render/boot_image.py``): found in its family, or baked on a CPU
VM of the run's own and that VM deleted."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from airflow.providers.common.compat.sdk import Context

from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.ledger.billing import VM_SPANS_KEY
from airflow_provider_tpu_rl.operators.base import expiry_of_run, fail_fast
from airflow_provider_tpu_rl.operators.tpu_vm import _TpuVmOperator
from airflow_provider_tpu_rl.render import boot_image, tpu_vm
from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.cluster import CpuVmSpec
from airflow_provider_tpu_rl.spec.pipeline import TpuVmPipelineSpec
from airflow_provider_tpu_rl.spec.preflight import parse_json_document
from airflow_provider_tpu_rl.timeouts import stage_command_timeout

# The bake VM's billed spans go under VM_SPANS_KEY ("vm_spans"; the ledger stores them, table
# run_vm_spans: docs/ledger.md): a list of {"name", "zone", "machine_type", "started", "ended"},
# RFC 3339 UTC times: the VM's lastStartTimestamp (creationTimestamp when it has none) to its
# lastStopTimestamp (else the moment its stop was asked). Compute Engine bills a VM's vCPUs and
# memory from its start until it stops.


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def vm_span(resource: dict[str, Any], stop_asked: float) -> dict[str, str]:
    """The billed span of a VM, from its ``compute instances describe`` JSON (see :data:`VM_SPANS_KEY`)."""
    machine = str(resource.get("machineType") or "").rsplit("/", 1)[-1]
    started = resource.get("lastStartTimestamp") or resource.get("creationTimestamp")
    if not machine or not started:
        raise ConfigurationError(f"VM {resource.get('name')} reports no machine type or start time")
    return {
        "name": str(resource.get("name") or ""),
        "zone": str(resource.get("zone") or "").rsplit("/", 1)[-1],
        "machine_type": machine,
        "started": str(started),
        "ended": str(resource.get("lastStopTimestamp") or _utc(stop_asked)),
    }


class _BootImageOperator(_TpuVmOperator):
    """What the bake's tasks share: the switch and the image the TPU VM runs.

    :param bake: bake (or reuse) the boot image; off (or a runtime other than ``container``): the
        task does nothing and the TPU VM boots from its own image family.
    :param workload_image: the image training runs in; empty = the post-training image.
    """

    template_fields: Sequence[str] = (*_TpuVmOperator.template_fields, "bake", "workload_image")

    def __init__(self, *, bake: bool | str = True, workload_image: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bake = bake
        self.workload_image = workload_image

    def bake_spec(self, context: Context) -> TpuVmPipelineSpec | None:
        """The pipeline spec, None when nothing is baked."""
        if not rules.boolean("bake", self.bake):
            return None
        return self.spec(context, runtime="container", workload_image=self.workload_image or None)


class TpuVmBootImageOperator(_BootImageOperator):
    """Find the TPU VM's baked boot image, or bake it: its family is named after the workload
    image's digest (a tag resolved at the registry first), so a run reuses the image every earlier
    run with the same image left, and bakes only when the image changed.

    The bake runs on a CPU VM of its own (``tpu-rl-bake-<run suffix>``, booted from the TPU VM's
    image family): Docker installed, the image pulled by digest, the VM stopped, its disk imaged into
    the family, the VM deleted (also when a step fails; ``delete_bake_vm`` is its teardown, and the
    janitor deletes it at its ``tpu-rl-expires``).

    Returns ``{"boot_image_family", "boot_image", "digest", "baked", "vm_spans"}``: the family the
    TPU VM boots from (None: nothing baked), the image found or made, whether this run baked it,
    and the bake VM's billed spans (:data:`VM_SPANS_KEY`; empty when nothing was baked).

    :param service_account: the bake VM's service account (it pulls the image); empty = the
        project's default.
    :param max_vm_hours: the bake VM's expiry label, counted from the DAG run's start.
    """

    template_fields: Sequence[str] = (*_BootImageOperator.template_fields, "service_account", "max_vm_hours")

    def __init__(
        self, *, service_account: str | None = None, max_vm_hours: int | str = 72, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.service_account = service_account
        self.max_vm_hours = max_vm_hours

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        p = self.bake_spec(context)
        if p is None:
            self.log.info("bake is off: the TPU VM boots from its own image family and pulls the image")
            return {
                "boot_image_family": None,
                "boot_image": None,
                "digest": None,
                "baked": False,
                VM_SPANS_KEY: [],
            }
        image = p.workload_image
        digest = boot_image.pinned_digest(image) or self.resolve_digest(image)
        family = boot_image.family_of(digest)
        found = self.ready_image(p.vm.project, family)
        if found is not None:
            self.log.info("Boot image %s of family %s holds %s: nothing to bake", found, family, image)
            return {
                "boot_image_family": family,
                "boot_image": found,
                "digest": digest,
                "baked": False,
                VM_SPANS_KEY: [],
            }
        self.log.info("No boot image in family %s yet: baking one with %s (%s)", family, image, digest)
        hours = rules.integer("max_vm_hours", self.max_vm_hours, 1, 24 * 7)
        spans = self.bake_image(p, family, digest, expiry_of_run(context, hours))
        made = self.ready_image(p.vm.project, family)
        if made is None:
            raise ConfigurationError(f"the image baked into family {family} is not READY after its create")
        return {
            "boot_image_family": family,
            "boot_image": made,
            "digest": digest,
            "baked": True,
            VM_SPANS_KEY: spans,
        }

    def resolve_digest(self, image: str) -> str:
        """The digest ``image``'s tag names now, from its registry."""
        result = self.hook.run_checked(boot_image.resolve_digest(image), log_output=False)
        digest = boot_image.parse_digest(result.output_lines)
        if digest is None:
            raise ConfigurationError(
                f"the registry gave no digest for {image}: {' '.join(result.output_lines[-2:])}"
            )
        self.log.info("%s is %s", image, digest)
        return digest

    def ready_image(self, project: str, family: str) -> str | None:
        """The name of the family's newest image when it can boot a VM (READY), else None."""
        result = self.hook.run(boot_image.find_image(project, family), log_output=False)
        if not result.ok:
            if any(marker in result.output for marker in boot_image.NO_IMAGE):
                return None
            self.hook.check_result(boot_image.find_image(project, family), result)
        described = parse_json_document(result.output_lines) or {}
        status = described.get("status")
        if status != boot_image.READY:
            self.log.info(
                "Family %s's newest image %s is %s, not usable yet", family, described.get("name"), status
            )
            return None
        return str(described.get("name"))

    def bake_image(
        self, p: TpuVmPipelineSpec, family: str, digest: str, expires_at: int
    ) -> list[dict[str, str]]:
        """Bake on the run's own bake VM and delete it; the VM's billed span."""
        vm = p.bake_vm
        labels = tpu_vm.vm_labels(p, expires_at)
        create, ssh, stop, describe, make, delete = boot_image.bake_commands(
            p, family, digest, labels, ssh_key_file=str(self.hook.ssh_key_file())
        )
        created = self.hook.run(create, timeout=stage_command_timeout("vm_create"))
        if created.ok_marker:  # "already exists"
            # the run's own bake VM (its name is the run's), left by an earlier try: baked afresh
            self.log.warning("Bake VM %s is an earlier try's: deleted and created again", vm.vm_name)
            self.hook.run_checked(delete, timeout=stage_command_timeout("teardown"))
            created = self.hook.run(create, timeout=stage_command_timeout("vm_create"))
        try:
            self.hook.check_result(create, created)
            self.hook.run_checked(ssh, timeout=stage_command_timeout("bake"))
            stop_asked = time.time()
            self.hook.run_checked(stop, timeout=stage_command_timeout("vm_create"))
            described = self.hook.run_checked(describe, log_output=False)
            span = vm_span(parse_json_document(described.output_lines) or {}, stop_asked)
            self.hook.run_checked(make, timeout=stage_command_timeout("bake"))
        finally:
            self.hook.run_checked(delete, timeout=stage_command_timeout("teardown"))
        self.log.info(
            "Baked family %s on %s (%s, %s to %s)",
            family,
            vm.vm_name,
            span["machine_type"],
            span["started"],
            span["ended"],
        )
        return [span]


class BakeVmDeleteOperator(_BootImageOperator):
    """Delete the run's bake VM (``tpu-rl-bake-<run suffix>``; an absent one is deleted): the
    teardown of :class:`TpuVmBootImageOperator`, for a bake cut short (a killed worker, a timeout)."""

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        p = self.bake_spec(context)
        if p is None:
            return {"vm_name": None, "deleted": False}
        vm: CpuVmSpec = p.bake_vm
        self.hook.run_checked(boot_image.delete_bake_vm(vm), timeout=stage_command_timeout("teardown"))
        return {"vm_name": vm.vm_name, "deleted": True}


__all__ = ["VM_SPANS_KEY", "BakeVmDeleteOperator", "TpuVmBootImageOperator", "vm_span"]
