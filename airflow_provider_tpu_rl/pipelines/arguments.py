"""The arguments of each pipeline task, taken from ``validate``'s XCom: the resolved values, one
template each (``xcom``), read once per task try (``validated``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final

from airflow_provider_tpu_rl.compat import conf, exponential_backoff
from airflow_provider_tpu_rl.render.blueprint import TPU_GROUP

VALIDATED_MACRO: Final = "validated"
# validate's XCom, per task try: (dag_id, run_id, task_id, map_index, try_number) -> the values
_validated_cache: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_VALIDATED_CACHE_SIZE: Final = 32


def validated(ti: Any) -> Any:
    """The ``validate`` task's XCom (the derived values), pulled once per task try.

    Every templated field of a pipeline task reads it (:func:`xcom`), and Airflow renders each
    field on its own: without this, a task makes one XCom request per field (about ten).
    """
    key = (ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1), getattr(ti, "try_number", None))
    if key not in _validated_cache:
        _validated_cache[key] = ti.xcom_pull(task_ids="validate")
        while len(_validated_cache) > _VALIDATED_CACHE_SIZE:
            _validated_cache.popitem(last=False)
    return _validated_cache[key]


def xcom(key: str) -> str:
    """Template reading one derived value from the ``validate`` task's XCom (:func:`validated`;
    the DAG gets it from :data:`PIPELINE_MACROS`)."""
    return "{{ " + VALIDATED_MACRO + "(ti)['" + key + "'] }}"


BAKED_MACRO: Final = "baked"
BAKE_TASK_ID: Final = "bake_image"


def baked(ti: Any) -> Any:
    """The ``bake_image`` task's XCom (the TPU VM's boot image family), ``{}`` when it has none."""
    return ti.xcom_pull(task_ids=BAKE_TASK_ID) or {}


def bake_result(key: str) -> str:
    """Template reading one value of the ``bake_image`` task's result (None when it has none)."""
    return "{{ " + BAKED_MACRO + "(ti).get('" + key + "') }}"


COPIED_MACRO: Final = "copied_image"
COPY_TASK_ID: Final = "copy_workload_image"


def copied_image(ti: Any) -> Any:
    """The image GKE training runs: the ``copy_workload_image`` task's copy (streamed by the TPU
    node pool), else ``validate``'s ``image`` (no copy: ``image_repository`` empty)."""
    copy = ti.xcom_pull(task_ids=COPY_TASK_ID) or {}
    return copy.get("image") or validated(ti)["image"]


def copied_image_template() -> str:
    """Template reading :func:`copied_image`."""
    return "{{ " + COPIED_MACRO + "(ti) }}"


# A pipeline DAG's ``user_defined_macros``: what :func:`xcom`, :func:`bake_result` and
# :func:`copied_image_template` templates call.
PIPELINE_MACROS: Final[dict[str, Any]] = {
    VALIDATED_MACRO: validated,
    BAKED_MACRO: baked,
    COPIED_MACRO: copied_image,
}


def transient_retries() -> dict[str, Any]:
    """Retry settings for tasks whose failures can be transient (capacity, API 5xx, network).

    Operators raise ``AirflowFailException`` for configuration errors, which skips the remaining
    retries. The first delay is ``[tpu_rl] retry_delay`` seconds (default 120), doubling up to 30
    minutes: :func:`~airflow_provider_tpu_rl.compat.exponential_backoff` gives the multiplier
    each Airflow version expects (``True`` before 3.2, ``2.0`` from 3.2 on).
    """
    return {
        "retries": conf.getint("tpu_rl", "retries", fallback=3),
        "retry_delay": timedelta(seconds=conf.getfloat("tpu_rl", "retry_delay", fallback=120.0)),
        "retry_exponential_backoff": exponential_backoff(2.0),
        "max_retry_delay": timedelta(minutes=30),
    }


Value = Callable[[str], Any]


def _hf_token_arguments(value: Value) -> dict[str, Any]:
    return {
        "project_id": value("project"),
        "hf_token_conn_id": value("hf_token_conn_id"),
        "hf_token_secret": value("hf_token_secret"),
        "sync_from_connection": value("sync_hf_token"),
        "reader_service_accounts": value("secret_readers"),
    }


def _promote_arguments(value: Value, runner: str, image: Any) -> dict[str, Any]:
    return {
        "model": value("model"),
        "export_uri": value("export_uri"),
        "chips": value("chips"),
        "min_reward_gain": value("min_reward_gain"),
        "runner": runner,
        "image": image,
        "hf_model_path": value("hf_model_path"),
        "run_name": value("run_name"),
        "num_batches": value("num_batches"),
        "train_overrides": value("train_overrides"),
    }


def gke_task_arguments(value: Value, training_image: Any = None) -> dict[str, dict[str, Any]]:
    """The arguments of each ``tpu_rl_gke_pipeline`` operator, named by task id.

    ``value(key)`` gives one of ``validate``'s resolved values (``GkePipelineSpec.resolved``): the
    DAG passes a template that pulls it from XCom; a test passes the value itself.
    ``training_image``: the image ``train`` runs (the DAG: :func:`copied_image_template`, the copy
    streamed by the TPU node pool); None: ``value("image")``.
    """
    scope = {"project_id": value("project"), "location": value("region"), "bucket": value("bucket")}
    cluster = {
        **scope,
        "zone": value("zone"),
        "cluster_name": value("cluster_name"),
        "reservation": value("reservation"),
        "capacity": value("capacity"),
        "model": value("model"),
        "compute_type": value("compute_type"),
        "topology": value("topology"),
        "num_slices": value("num_slices"),
        "authorized_cidr": value("authorized_cidr"),
        "max_cluster_hours": value("max_cluster_hours"),
        "keep_cluster": value("keep_cluster"),
        # existing mode: the same tasks add and delete only the run's own pools (ClusterMode*Operator)
        "cluster_mode": value("cluster_mode"),
        "existing_cluster": value("existing_cluster"),
        "cpu_node_pool": value("cpu_node_pool"),
        "capacity_route": value("capacity_route"),
    }
    job = {
        **scope,
        "cluster_name": value("cluster_name"),
        "model": value("model"),
        "image": value("image"),
        "compute_type": value("compute_type"),
        "topology": value("topology"),
        "hf_token_conn_id": value("hf_token_conn_id"),
        "hf_token_secret": value("hf_token_secret"),
        # existing mode: the jobs on the run's own pools, queued on kueue_queue
        "existing_cluster": value("existing_cluster"),
        "kueue_queue": value("kueue_queue"),
        "cpu_node_pool": value("cpu_node_pool"),
        "capacity_route": value("capacity_route"),
    }
    # the conversions are CPU programs: the cluster's CPU node pool, not the slice's shape
    cpu_job = {key: item for key, item in job.items() if key not in ("compute_type", "topology")}
    return {
        "preflight": {
            "runner": "gke",
            "project_id": value("project"),
            "zone": value("zone"),
            "reservation": value("reservation"),
            "capacity": value("capacity"),
            "compute_type": value("compute_type"),
            "topology": value("topology"),
            "num_slices": value("num_slices"),
            "cluster_name": value("cluster_name"),
            "bucket": value("bucket"),
            "run_dirs": value("run_dirs"),
            "cancel_previous_writer": value("cancel_previous_writer"),
            "image_repository": value("image_repository"),
            "existing_cluster": value("existing_cluster"),
            "kueue_queue": value("kueue_queue"),
            "cpu_node_pool": value("cpu_node_pool"),
            "capacity_route": value("capacity_route"),
        },
        "ensure_bucket": scope,
        # the training image copied into the run's repository, streamed by the TPU node pool
        "copy_workload_image": {
            "project_id": value("project"),
            "location": value("region"),
            "image": value("image"),
            "image_repository": value("image_repository"),
        },
        # the cluster without its TPU node pool; the pool is deployed once the conversion is done
        # both write the blueprint: the TPU pool's image streaming and its account's role
        "deploy_cluster": {
            **cluster,
            "skip_groups": [TPU_GROUP],
            "image_repository": value("image_repository"),
        },
        "deploy_tpu_pool": {
            **cluster,
            "only_groups": [TPU_GROUP],
            "image_repository": value("image_repository"),
        },
        # keep_cluster keeps the cluster, never the TPU pool (it bills most)
        "destroy_tpu_pool": {
            **{key: item for key, item in cluster.items() if key != "keep_cluster"},
            "only_groups": [TPU_GROUP],
        },
        # the cluster holds its service accounts' grants: its record lists them for its destroy
        "sync_hf_token": {
            **_hf_token_arguments(value),
            "bucket": value("bucket"),
            "cluster_name": value("cluster_name"),
        },
        "convert_to_maxtext": {**cpu_job, "hf_model_path": value("hf_model_path")},
        "train": {
            **job,
            "image": value("image") if training_image is None else training_image,
            "cancel_previous_writer": value("cancel_previous_writer"),
            "run_name": value("run_name"),
            "num_batches": value("num_batches"),
            "train_overrides": value("train_overrides"),
            "num_slices": value("num_slices"),
            "workload_image_patched": value("workload_image_patched"),
        },
        "export_to_huggingface": {
            **cpu_job,
            "run_name": value("run_name"),
            "checkpoint_step": value("final_step"),
            "cancel_previous_writer": value("cancel_previous_writer"),
        },
        "promote_model": _promote_arguments(value, "gke", value("image")),
        "destroy_cluster": {
            **cluster,
            "delete_bucket": value("delete_bucket"),
            "hf_token_conn_id": value("hf_token_conn_id"),
            "hf_token_secret": value("hf_token_secret"),
        },
    }


def tpu_vm_task_arguments(value: Value, bake: Value | None = None) -> dict[str, dict[str, Any]]:
    """The arguments of each ``tpu_rl_tpu_vm_pipeline`` operator, named by task id (see above).

    ``bake(key)`` gives one value of the ``bake_image`` task's result (the DAG: :func:`bake_result`;
    none given: no baked image, the TPU VM boots from its own family).
    """
    result = bake or (lambda key: None)
    vm = {
        "project_id": value("project"),
        "zone": value("zone"),
        "vm_name": value("vm_name"),
        "bucket": value("bucket"),
        "model": value("model"),
    }
    stage = {
        **vm,
        "run_name": value("run_name"),
        "num_batches": value("num_batches"),
        "train_overrides": value("train_overrides"),
        "hf_model_path": value("hf_model_path"),
        "hf_token_conn_id": value("hf_token_conn_id"),
        "hf_token_secret": value("hf_token_secret"),
        # how the TPU VM runs MaxText (its install and training; the CPU VM always installs): every
        # stage gets it, so each checks train_overrides against the MaxText that trains
        "runtime": value("runtime"),
        "workload_image": value("workload_image"),
    }
    return {
        "preflight": {
            "runner": "tpu_vm",
            "project_id": value("project"),
            "zone": value("zone"),
            "reservation": value("reservation"),
            "capacity": value("capacity"),
            "compute_type": value("compute_type"),
            "topology": value("topology"),
            "num_slices": 1,
            "cpu_machine_types": value("cpu_machine_types"),
            "bucket": value("bucket"),
            "run_dirs": value("run_dirs"),
            "cancel_previous_writer": value("cancel_previous_writer"),
        },
        "ensure_bucket": {
            "project_id": value("project"),
            "location": value("region"),
            "bucket": value("bucket"),
        },
        "sync_hf_token": _hf_token_arguments(value),
        # The TPU VM's boot image: found or baked on a CPU VM of its own, beside the CPU VM's tasks.
        "bake_image": {
            **vm,
            "bake": value("bakes"),
            "workload_image": value("workload_image"),
            "service_account": value("service_account"),
            "max_vm_hours": value("max_vm_hours"),
        },
        "delete_bake_vm": {**vm, "bake": value("bakes"), "workload_image": value("workload_image")},
        "create_vm": {
            **vm,
            "reservation": value("reservation"),
            "capacity": value("capacity"),
            "service_account": value("service_account"),
            "hf_token_conn_id": value("hf_token_conn_id"),
            "hf_token_secret": value("hf_token_secret"),
            "keep_vm": value("keep_vm"),
            "max_vm_hours": value("max_vm_hours"),
            "boot_image_family": result("boot_image_family"),
        },
        "create_cpu_vm": {
            **vm,
            "cpu_machine_type": value("cpu_machine_type"),
            "service_account": value("service_account"),
            "hf_token_conn_id": value("hf_token_conn_id"),
            "hf_token_secret": value("hf_token_secret"),
            "keep_vm": value("keep_vm"),
            "max_vm_hours": value("max_vm_hours"),
        },
        "install_cpu_vm": {**stage, "stage": "install", "on_machine": "cpu"},
        "install_maxtext": {
            **stage,
            "stage": "install",
            "on_machine": "tpu",
            "boot_image_family": result("boot_image_family"),
        },
        "convert_to_maxtext": {**stage, "stage": "convert"},
        "train": {**stage, "stage": "train", "cancel_previous_writer": value("cancel_previous_writer")},
        "export_to_huggingface": {
            **stage,
            "stage": "export",
            "cancel_previous_writer": value("cancel_previous_writer"),
        },
        # The TPU VM goes as soon as the actor checkpoint is committed; the CPU VM's delete is the
        # last teardown and owns delete_bucket.
        # the image training ran in (runtime container; install: MaxText from sources, no image)
        "promote_model": _promote_arguments(value, "tpu_vm", value("training_image")),
        "delete_vm": {**vm, "keep_vm": value("keep_vm"), "delete_bucket": False},
        "delete_cpu_vm": {**vm, "keep_vm": value("keep_vm"), "delete_bucket": value("delete_bucket")},
    }
