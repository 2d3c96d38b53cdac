"""The run parameters of the two pipelines, in one table.

Each row says everything about one key of a DAG run's conf: its JSON type, its default on each
pipeline, the ``[tpu_rl] default_*`` option that prefills it, whether the default is an example a
user must replace, and the trigger form's title, section, help text and JSON schema (with the rule
``validate`` gives, in words). The defaults, the conf types, the per-environment options, the
placeholders, both trigger forms, the sweep example's params, ``tpu-rl plan --help`` and
``docs/params.md``'s table are all read from it (``docs/adding-a-run-parameter.md``).

Plain Python: no Airflow import (the forms' ``Param`` objects are built in ``pipelines/form.py``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, TypeVar

from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.cluster import (
    CAPACITIES,
    CHIPS_PER_VM,
    CPU_VM_MACHINE_TYPE,
    FALLBACK,
    K8S_NAME,
    ON_DEMAND,
    SYSTEM_MACHINE_TYPE,
    V6E_TOPOLOGIES,
    SliceShape,
)
from airflow_provider_tpu_rl.spec.existing_cluster import (
    CAPACITY_ROUTES,
    CLUSTER_MODES,
    CREATE,
    EXISTING_CLUSTER_RULE,
    EXISTING_CLUSTER_VALUE,
    POOLS_ROUTE,
)
from airflow_provider_tpu_rl.spec.presets import (
    REHEARSAL_HF_MODEL,
    REHEARSAL_MODEL,
    Runner,
    get_preset,
    presets_for,
)

# The Hub checkpoint MaxText converts for a preset that names none (HF_IDS, src/maxtext/utils/globals.py).
MAXTEXT_CHECKPOINT = {REHEARSAL_MODEL: REHEARSAL_HF_MODEL}

T = TypeVar("T")

GKE: Final = "gke"
TPU_VM: Final = "tpu_vm"
PIPELINES: Final = (GKE, TPU_VM)
Pipeline = Literal["gke", "tpu_vm"]
RUNNERS: Final = {GKE: Runner.GKE, TPU_VM: Runner.TPU_VM}

# The trigger form's sections. Airflow 3's form opens only "Run Parameters" (where params without
# a section go): the cloud fields, which every user must change, are in it (pipelines/form.py).
CLOUD, CLUSTER, VM, MODEL, SAFETY = "Run Parameters", "Cluster", "VM", "Model & training", "Safety"

# How the TPU VM runs MaxText: ``container`` pulls the prebuilt post-training image (the GKE jobs'
# image) and trains in it; ``install`` installs MaxText from sources on the billed TPU VM first
# (the tutorial's way, 15-30 minutes). The CPU VM always installs (it is not TPU time).
TPU_VM_RUNTIMES: Final = ("container", "install")

Kind = Literal["str", "int", "number", "bool", "object", "str_list", "list"]
JSON_TYPES: Final[Mapping[str, str | list[str]]] = {
    "str": "string",
    # one value, or an ordered list of them (``capacity``)
    "str_list": ["string", "array"],
    # a list of strings, one a line in both forms (``capacity_fallback``)
    "list": "array",
    "int": "integer",
    "number": "number",
    "bool": "boolean",
    "object": "object",
}
TYPE_RULES: Final[Mapping[str, str]] = {
    "str": "must be a string",
    "int": "must be an integer",
    "number": "must be a number",
    "bool": "must be true or false",
    "object": "must be an object of MaxText key → value",
    "str_list": "must be a string or a list of strings",
    "list": "must be a list of strings",
}


@dataclass(frozen=True)
class PerPipeline(Generic[T]):
    """A value that differs between the two pipelines."""

    gke: T
    tpu_vm: T

    def on(self, pipeline: str) -> T:
        return self.gke if pipeline == GKE else self.tpu_vm


def _on(value: Any, pipeline: str) -> Any:
    return value.on(pipeline) if isinstance(value, PerPipeline) else value


def optional(pattern: re.Pattern[str]) -> str:
    """The rule's regex, or the empty string (which, like null, means "the preset's value")."""
    return f"^$|(?:{pattern.pattern})"


@dataclass(frozen=True)
class RunParam:
    """One key of a pipeline run's conf, and its field in the trigger form."""

    key: str
    kind: Kind
    title: str
    section: str
    help: str | PerPipeline[str]  # the form's help text
    doc: str  # what docs/params.md says of it
    default: Any = None
    # null or "" is accepted and means "the preset's value" (or "none")
    nullable: bool = False
    pipelines: tuple[str, ...] = PIPELINES
    # JSON-schema keywords beyond the type: pattern, enum, minimum, maxLength, values_display…
    schema: Mapping[str, Any] = field(default_factory=dict)
    # what validate says of a value the pattern refuses, in words (shown next to the field)
    rule: str | None = None
    # the [tpu_rl] option that prefills it for a whole Airflow environment
    option: str | PerPipeline[str | None] | None = None
    # the default is the form's example, which validate refuses: what to set instead
    placeholder: str | None = None
    # docs/params.md's default column where the value alone does not say it
    doc_default: str | None = None

    def default_on(self, pipeline: str) -> Any:
        """The default on ``pipeline`` (a fresh copy of a mutable one)."""
        return copy.deepcopy(_on(self.default, pipeline))

    def option_on(self, pipeline: str) -> str | None:
        return _on(self.option, pipeline)  # type: ignore[no-any-return]

    def form_field(self, pipeline: str) -> dict[str, Any]:
        """The form metadata on ``pipeline``: title, section, description, JSON schema, rule."""
        json_type = JSON_TYPES[self.kind]
        metadata: dict[str, Any] = {
            "title": self.title,
            "section": self.section,
            "description": _on(self.help, pipeline),
            "type": ["null", json_type] if self.nullable and isinstance(json_type, str) else json_type,
        }
        metadata.update({key: _on(value, pipeline) for key, value in self.schema.items()})
        if self.rule:
            metadata["rule"] = self.rule
        return metadata


def model_label(model: str, runner: Runner | None = None) -> str:
    """A model preset in the forms' dropdowns, one style on both pipelines:
    ``qwen3-30b-a3b: Qwen/Qwen3-30B-A3B-Instruct-2507 on TPU v6e-32 (4x8)``; the rehearsal's says
    it is one: ``qwen3-0.6b: rehearsal of 4 steps, Qwen/Qwen3-0.6B on TPU v6e-16 (4x4)``."""
    preset = get_preset(model, runner=runner)
    checkpoint = preset.hf_model_path or MAXTEXT_CHECKPOINT.get(model, "MaxText's checkpoint")
    shape = SliceShape(preset.compute_type, preset.topology)
    slices = f" x {preset.num_slices}" if preset.num_slices > 1 else ""
    label = f"{checkpoint} on TPU {shape.tpu_type}{slices} ({preset.topology})"
    if model == REHEARSAL_MODEL:
        return f"{model}: rehearsal of {preset.num_batches} steps, {label}"
    return f"{model}: {label}"


def _models(pipeline: str) -> list[str]:
    return presets_for(RUNNERS[pipeline])


def _chips(topology: str) -> int:
    rows, columns = topology.split("x")
    return int(rows) * int(columns)


def _chips_per_vm(count: int) -> str:
    return f"{count} chip per VM" if count == 1 else f"{count} chips per VM"


_TOPOLOGIES: Final = sorted(V6E_TOPOLOGIES, key=lambda t: (_chips(t), t))

RUN_NAME_HELP: Final = (
    "MaxText run_name: the folder of this run's checkpoints and export (trained/RUN_NAME/, "
    "hf-trained/RUN_NAME/). Empty = a name unique to this DAG run, so every run trains its own "
    "model. Give an earlier run's name only on purpose, to resume that run: it goes on from that "
    "run's checkpoints, and never starts a second job on a folder a live job is writing."
)
_GKE_ONLY = (GKE,)
_TPU_VM_ONLY = (TPU_VM,)

# The table. Its order is the forms' order within each section (the open section first).
RUN_PARAMS: Final[tuple[RunParam, ...]] = (
    RunParam(
        "model",
        "str",
        "Model",
        MODEL,
        PerPipeline(
            "MaxText model_name of a multi-host preset; the preset fills every value left empty.",
            "MaxText model_name of a single-host preset; the preset fills every value left empty.",
        ),
        "MaxText `model_name` of a preset (`spec/presets.py`): the tutorial's values for every field left empty",
        default=PerPipeline("qwen3-30b-a3b", "llama3.1-8b-Instruct"),
        schema={
            "enum": PerPipeline(_models(GKE), _models(TPU_VM)),
            "values_display": PerPipeline(
                {m: model_label(m, Runner.GKE) for m in _models(GKE)},
                {m: model_label(m, Runner.TPU_VM) for m in _models(TPU_VM)},
            ),
        },
    ),
    RunParam(
        "project",
        "str",
        "GCP project",
        CLOUD,
        "Project ID that owns the TPUs, the bucket and the reservation.",
        "the GCP project of the TPUs, the bucket and the reservation",
        default="my-tpu-project",
        schema={"pattern": rules.PROJECT_ID.pattern},
        rule=rules.PROJECT_ID_RULE,
        option="default_project",
        placeholder="set project to your GCP project",
    ),
    RunParam(
        "region",
        "str",
        "Region",
        CLOUD,
        "Region of the GKE cluster and the bucket, e.g. us-east5.",
        "region of the GKE cluster and the bucket",
        default="us-east5",
        pipelines=_GKE_ONLY,
        schema={"pattern": rules.REGION.pattern},
        rule=rules.REGION_RULE,
        option="default_region",
    ),
    RunParam(
        "zone",
        "str",
        "Zone",
        CLOUD,
        PerPipeline(
            "Zone of the TPU node pool; must be inside the region (checked by validate).",
            "Zone of the TPU VM and its reservation, e.g. us-east5-b (the bucket goes to its region).",
        ),
        "zone of the TPU node pool (inside `region`) or of the TPU VM",
        default="us-east5-b",
        schema={"pattern": rules.ZONE.pattern},
        rule=rules.ZONE_RULE,
        option="default_zone",
    ),
    RunParam(
        "cluster_name",
        "str",
        "Cluster name",
        CLUSTER,
        "GKE cluster / Cluster Toolkit deployment: lowercase letter first, [a-z0-9-], at most 20 "
        "characters. Two runs at the same time must not share a cluster name.",
        "GKE cluster name: lowercase letters, digits and hyphens, a letter first, ≤ 20 characters; two "
        "runs at the same time must not share it (the cluster lease refuses the second)",
        default="tpu-rl",
        pipelines=_GKE_ONLY,
        schema={"pattern": rules.GKE_CLUSTER_NAME.pattern, "maxLength": 20},
        rule=rules.GKE_CLUSTER_NAME_RULE,
    ),
    RunParam(
        "cluster_mode",
        "str",
        "Cluster mode",
        CLUSTER,
        "create (the default): the run deploys its own cluster with Cluster Toolkit and destroys it. "
        "existing: the run uses a GKE cluster a platform team runs (existing_cluster), adds only its "
        "own TPU node pool (and a CPU pool when cpu_node_pool is empty) and deletes only those; the "
        "cluster is never deleted. See docs/platform-teams.md.",
        "`create`: the run deploys its cluster and destroys it; `existing`: the run names a cluster "
        "it does not own (`existing_cluster`) and creates and deletes only its own node pools in it "
        "([platform teams](platform-teams.md))",
        default=CREATE,
        pipelines=_GKE_ONLY,
        schema={"enum": list(CLUSTER_MODES)},
    ),
    RunParam(
        "existing_cluster",
        "str",
        "Existing cluster",
        CLUSTER,
        "With cluster mode existing: PROJECT/LOCATION/NAME of the GKE cluster (its project is the "
        "run's project). Empty with create.",
        "with `cluster_mode` `existing`: `PROJECT/LOCATION/NAME` of the GKE cluster the run uses and "
        "never deletes (its project is the run's `project`); empty with `create`",
        default="",
        nullable=True,
        pipelines=_GKE_ONLY,
        schema={"pattern": optional(EXISTING_CLUSTER_VALUE)},
        rule=EXISTING_CLUSTER_RULE,
        doc_default="empty",
    ),
    RunParam(
        "kueue_queue",
        "str",
        "Kueue LocalQueue",
        CLUSTER,
        "With cluster mode existing: the Kueue LocalQueue of namespace default the run's jobs go to; "
        "empty: the cluster's only one. Empty with create.",
        "with `cluster_mode` `existing`: the Kueue LocalQueue (namespace `default`) the run's jobs go "
        "to; empty: the only one there (preflight refuses a cluster with none, or several)",
        default="",
        nullable=True,
        pipelines=_GKE_ONLY,
        schema={"pattern": optional(K8S_NAME)},
        rule="a Kubernetes name like team-queue",
        doc_default="empty",
    ),
    RunParam(
        "cpu_node_pool",
        "str",
        "CPU node pool",
        CLUSTER,
        "With cluster mode existing: the cluster's CPU node pool the conversion and the export run "
        "on; empty: the run creates its own (tpu-rl-<run>-cpu) and deletes it. Empty with create.",
        "with `cluster_mode` `existing`: the cluster's CPU node pool the conversion and the export run "
        "on; empty: the run creates `tpu-rl-<run>-cpu` and deletes it",
        default="",
        nullable=True,
        pipelines=_GKE_ONLY,
        schema={"pattern": optional(K8S_NAME)},
        rule="a Kubernetes name like cpu-np",
        doc_default="empty",
    ),
    RunParam(
        "capacity_route",
        "str",
        "Capacity route",
        CLUSTER,
        "With cluster mode existing: pools (the default): the run creates its own TPU node pool with "
        "one capacity kind. compute-class: the run applies one GKE ComputeClass whose priorities are "
        "the ordered capacity kinds and GKE auto-creates a node pool for the first it can get; the "
        "class is deleted at teardown. Pools with create.",
        "with `cluster_mode` `existing`: `pools`, the run's own TPU node pool with one capacity kind; "
        "`compute-class`, one GKE ComputeClass with the ordered `capacity` kinds as priorities, GKE "
        "auto-creating a node pool for the first it can get "
        "([platform teams](platform-teams.md#the-computeclass-route)); `create` takes `pools`",
        default=POOLS_ROUTE,
        pipelines=_GKE_ONLY,
        schema={"enum": list(CAPACITY_ROUTES)},
    ),
    RunParam(
        "vm_name",
        "str",
        "VM name",
        VM,
        "Compute Engine instance name of the TPU VM; the CPU VM is named <vm_name>-cpu. Two runs at "
        "the same time must not share it.",
        "TPU VM name (the CPU VM is `<vm_name>-cpu`)",
        default="tpu-rl-vm",
        pipelines=_TPU_VM_ONLY,
        schema={"pattern": rules.GCE_NAME.pattern},
        rule=rules.gce_name_rule("VM name"),
    ),
    RunParam(
        "bucket",
        "str",
        "GCS bucket",
        CLOUD,
        PerPipeline(
            "Bucket name without gs://. Created if missing, kept afterwards (see delete_bucket); bucket "
            "names are global.",
            "Bucket name without gs://. The converted checkpoint, the training checkpoints and the "
            "export are written here; kept afterwards (see delete_bucket); bucket names are global.",
        ),
        "GCS bucket for checkpoints, Pathways data, Terraform state and the run's curves",
        default="my-tpu-rl-bucket",
        schema={"pattern": rules.BUCKET_CHARS.pattern, "minLength": 3, "maxLength": 222},
        rule=rules.BUCKET_CHARS_RULE,
        option="default_bucket",
        placeholder="set bucket to a Cloud Storage bucket name of yours",
    ),
    RunParam(
        "reservation",
        "str",
        "TPU reservation",
        CLOUD,
        PerPipeline(
            "Name of the v6e reservation the TPU node pool consumes, with reservation capacity; empty "
            "with on-demand, spot or flex-start capacity.",
            "Name of the v6e-8 reservation the VM is bound to (RESERVATION_BOUND) with reservation "
            "capacity; empty with on-demand, spot or flex-start capacity.",
        ),
        "TPU reservation name, with `reservation` capacity; empty with `on-demand`, `spot` or `flex-start`",
        default="",
        nullable=True,
        schema={"pattern": optional(rules.GCE_NAME)},
        rule=rules.gce_name_rule("reservation name"),
        option=PerPipeline("default_gke_reservation", "default_tpu_vm_reservation"),
        doc_default="empty",
    ),
    RunParam(
        "capacity",
        "str_list",
        "TPU capacity",
        CLOUD,
        PerPipeline(
            "How the TPU node pool is provisioned (one kind here; the kinds tried after it go in "
            "capacity fallback). on-demand (the default): the list price, no reservation, no preemption. reservation: "
            "from the reservation named in reservation. spot: Spot VMs, much cheaper but preemptible "
            "at any time; training resumes from its newest checkpoint. flex-start: Dynamic Workload "
            "Scheduler capacity, queued until free, then runs for a bounded time. Only reservation "
            "takes a reservation. See the README's capacity table.",
            "How the TPU VM is provisioned (one kind here; the kinds tried after it go in capacity "
            "fallback). on-demand (the default): the list "
            "price, no reservation, no preemption. reservation: from the reservation named in "
            "reservation. spot: Spot VMs, much cheaper but preemptible at any time; training resumes "
            "from its newest checkpoint. flex-start: Dynamic Workload Scheduler capacity, queued until "
            "free, then runs for a bounded time. Only reservation takes a reservation. See the "
            "README's capacity table.",
        ),
        "how the TPUs are provisioned: `on-demand`, `reservation`, `spot` or `flex-start` (what each "
        "renders, costs and risks, and why `on-demand` is the default: [README, TPU capacity]"
        "(../README.md#tpu-capacity-on-demand-reservation-spot-or-flex-start)), or an ordered list of "
        'them, like `["reservation", "flex-start", "spot"]`, tried in turn (on GKE a flex-start '
        "pool before other kinds is proved by a placeholder pod: [capacity that falls back]"
        "(../README.md#capacity-that-falls-back); the shipped DAGs' form and Param take one kind, the "
        "kinds after it go in `capacity_fallback`; a list goes to the operators and `tpu-rl plan`). A "
        "conf (REST, CLI, `tpu-rl plan`) that names a `reservation` and no `capacity` consumes it",
        default=ON_DEMAND,
        # The shipped DAGs' form and Param take one kind, a dropdown: Airflow 2.11's trigger form
        # renders a field whose type includes "array" as a textarea of the value's items, a string's
        # characters one per line (www/templates/airflow/trigger.html), and Airflow 3's form failed
        # the same field's dropdown; the form's ordered list is ``capacity_fallback`` (the next row),
        # and a list goes to the operators (``capacity=[...]``) and to ``tpu-rl plan`` (the spec
        # takes both).
        schema={"type": "string", "enum": list(CAPACITIES)},
        doc_default="`on-demand`; `reservation` where `[tpu_rl] default_*_reservation` is set",
    ),
    RunParam(
        FALLBACK,
        "list",
        "TPU capacity fallback",
        CLOUD,
        PerPipeline(
            "Capacity kinds tried after capacity, in order, one a line (on-demand, reservation, "
            "spot, flex-start): a kind refused for lack of capacity (a stockout, a quota, a full "
            "reservation) moves the TPU node pool's create to the next, in the same task try. "
            "A flex-start pool with kinds after it is proved by a placeholder pod. Empty: capacity alone.",
            "Capacity kinds tried after capacity, in order, one a line (on-demand, reservation, "
            "spot, flex-start): a kind refused for lack of capacity (a stockout, a quota, a full "
            "reservation) moves the TPU VM's create to the next, in the same task try. Empty: "
            "capacity alone.",
        ),
        "the capacity kinds tried after `capacity`, in order (one a line in the forms: `capacity` "
        "is a dropdown of one kind); `capacity` then this list is the run's ordered capacity, as a "
        "`capacity` list ([capacity that falls back](../README.md#capacity-that-falls-back)); "
        "`validate` refuses an unknown kind or one tried already; blank lines are ignored",
        default=[],
        nullable=True,
        # A plain array of strings: both forms render it as a textarea, one item a line, and submit
        # the lines in their order (Airflow 2.11: www/templates/airflow/trigger.html's
        # valuetype="array" textarea, static/js/trigger.js's updateJSONconf keeps the trimmed
        # non-blank lines, none = null; Airflow 3.3: the UI's FieldSelector picks its string-array
        # textarea for type array with items of type string, split on newlines). "examples" or
        # "enum" would make both a multi-select, and 2.11's submits in the options' order. Nullable:
        # both submit an emptied field as null, and 3.3 marks a null non-nullable field required.
        schema={"items": {"type": "string"}},
        doc_default="empty",
    ),
    RunParam(
        "image",
        "str",
        "Workload image",
        MODEL,
        "Container image of the jobs; empty = the preset's tpu_post_training image.",
        "container image of the GKE jobs; empty = the preset's `tpu_post_training` image",
        nullable=True,
        pipelines=_GKE_ONLY,
        schema={"pattern": optional(rules.IMAGE)},
        rule=rules.IMAGE_RULE,
        doc_default="preset",
    ),
    RunParam(
        "workload_image_patched",
        "bool",
        "Image is patched",
        MODEL,
        "The workload image already holds the tutorials' two start-up patches (built from "
        "docker/workload.Dockerfile): the train command no longer rewrites installed files. Leave off "
        "with the stock tpu_post_training image.",
        "the `image` already holds the tutorials' two start-up patches (built from "
        "`docker/workload.Dockerfile`): the train command no longer rewrites installed files",
        default=False,
        pipelines=_GKE_ONLY,
    ),
    RunParam(
        "image_repository",
        "str",
        "Stream the image from this repository",
        MODEL,
        "Artifact Registry Docker repository (its ID, in the run's project and region; created when "
        "missing) the training image is copied into, once per digest, so the TPU node pool streams it "
        "(GKE image streaming) instead of pulling it whole. Empty: no copy, no streaming.",
        "Artifact Registry Docker repository (its ID, in the run's `project` and `region`; created when "
        "missing) that `copy_workload_image` copies `image` into, once per digest and kept for later "
        "runs; the TPU node pool then runs the copy with **image streaming** (`enable_gcfs`) instead of "
        "pulling the whole image before training starts. The copy runs on the Airflow worker (`gcloud container "
        "images add-tag`, one layer at a time, held in memory: the worker needs memory for the image's largest "
        "layer), hence off by default ([first real run](first-real-run.md)). Empty: no copy, the pool pulls the "
        "image whole",
        default="",
        nullable=True,
        pipelines=_GKE_ONLY,
        schema={"pattern": optional(rules.REPOSITORY_ID)},
        rule=rules.REPOSITORY_ID_RULE,
    ),
    RunParam(
        "compute_type",
        "str",
        "TPU machine type",
        CLUSTER,
        "Node machine type; empty = the preset's (ct6e-standard-4t for multi-host).",
        "TPU node machine type; empty = the preset's",
        nullable=True,
        pipelines=_GKE_ONLY,
        schema={
            "enum": [None, *sorted(CHIPS_PER_VM)],
            "values_display": {
                None: "(preset value)",
                **{m: f"{m} ({_chips_per_vm(n)})" for m, n in CHIPS_PER_VM.items()},
            },
        },
        doc_default="preset",
    ),
    RunParam(
        "topology",
        "str",
        "Slice topology",
        CLUSTER,
        "v6e slice shape (4x8 = v6e-32); empty = the preset's.",
        "v6e slice shape; empty = the preset's",
        nullable=True,
        pipelines=_GKE_ONLY,
        schema={
            "enum": [None, *_TOPOLOGIES],
            "values_display": {None: "(preset value)", **{t: f"{t} (v6e-{_chips(t)})" for t in _TOPOLOGIES}},
        },
        doc_default="preset",
    ),
    RunParam(
        "num_slices",
        "int",
        "Number of slices",
        CLUSTER,
        "TPU node pools (slices); empty = the preset's (1).",
        "TPU node pools (slices); empty = the preset's",
        nullable=True,
        pipelines=_GKE_ONLY,
        schema={"minimum": 1, "maximum": 64},
        doc_default="preset",
    ),
    RunParam(
        "hf_model_path",
        "str",
        "Hugging Face checkpoint",
        MODEL,
        PerPipeline(
            "HF repo id to convert (org/model); empty = the preset's.",
            "HF repo id to convert (org/model); empty = MaxText's checkpoint for the model.",
        ),
        "Hugging Face repo id to convert; empty = the preset's",
        nullable=True,
        schema={"pattern": optional(rules.HF_REPO_ID)},
        rule=rules.HF_REPO_ID_RULE,
        doc_default="preset",
    ),
    RunParam(
        "run_name",
        "str",
        "Training run name",
        MODEL,
        RUN_NAME_HELP,
        "the run's folder (`trained/RUN_NAME/`, `hf-trained/RUN_NAME/`); an earlier run's name resumes "
        "that run (see [run safety](run-safety.md))",
        nullable=True,
        schema={"pattern": optional(rules.RUN_NAME)},
        rule=rules.RUN_NAME_RULE,
        doc_default="`rl-<6 hex of the DAG run>`",
    ),
    RunParam(
        "num_batches",
        "int",
        "Training batches (steps)",
        MODEL,
        "GRPO steps; the exported checkpoint is the one of the last step. Empty = 50 (at most 10,000,000).",
        "GRPO steps; the exported checkpoint is the last step's",
        nullable=True,
        schema={"minimum": 1},
        doc_default="preset (50)",
    ),
    RunParam(
        "train_overrides",
        "object",
        "MaxText overrides",
        MODEL,
        'Extra train_rl key=value overrides as a JSON object, e.g. {"learning_rate": 1e-5}. Keys are '
        "checked against the MaxText release that runs them (0.2.4 on GKE, 0.2.3 on the TPU VM) and "
        "values against the key's type; paths, model_name, run_name, num_batches (use its field) and "
        "the HF token cannot be set here. Evaluation (the mean reward before and after training): "
        "MaxText greedily answers num_test_batches batches of batch_size test prompts before "
        "training, after it and every eval_interval (10) steps; the presets evaluate 2 batches (Qwen: "
        "2 x 8 prompts, 7 evaluations over 50 steps = 112 answers, fewer generations than 4 training "
        "steps' rollouts), Gemma 5, Llama 10. "
        '{"num_test_batches": 0} turns it off: no reward is recorded.',
        "object of MaxText key → value, applied last (`learning_rate`, `num_test_batches`, "
        "`eval_interval`, …). **Evaluation**: MaxText greedily answers `num_test_batches` batches of "
        "`batch_size` test prompts before training, after it and every `eval_interval` (10) steps, and "
        "records the mean reward; the presets evaluate 2 batches (Qwen: 2 x 8 prompts, 7 evaluations "
        "over the default 50 steps = 112 answers, fewer generations than 4 training steps' rollouts of "
        '8 x 4, and no training work), 5 (Gemma) and 10 (Llama). `{"num_test_batches": 0}` turns it '
        "off: the run records no reward, and says so. Settings a later task cannot live with are "
        "refused (see below)",
        default={},
        nullable=True,
        schema={
            "type": "object",
            "propertyNames": {"pattern": rules.MAXTEXT_KEY.pattern},
            # null too: a NaN in the JSON reaches the task as null, and validate names it in one line
            "additionalProperties": {"type": ["null", "string", "number", "boolean", "object", "array"]},
        },
        rule=rules.MAXTEXT_KEY_RULE,
    ),
    RunParam(
        "min_reward_gain",
        "number",
        "Promotion: minimum reward gain",
        MODEL,
        "Promote the trained model (its asset event, its ledger row says promoted) only when its mean "
        "reward after training exceeds the one before by at least this much. Empty = no gate (every "
        "exported model is promoted). Without evaluation (num_test_batches 0) there is no gate.",
        "the promotion gate: with evaluation on, a model whose mean reward gained less than this "
        "(after minus before training) is *not promoted*: `promote_model` is skipped, no asset event "
        "is emitted and the ledger, `tpu-rl runs` and the dashboard say so; empty = no gate; no "
        "evaluation = no gate ([model assets](assets.md#the-promotion-gate))",
        nullable=True,
        schema={"minimum": -1000, "maximum": 1000},
        doc_default="empty (no gate)",
    ),
    RunParam(
        "keep_cluster",
        "bool",
        "Keep the cluster",
        SAFETY,
        "Leave the cluster running after the run (it keeps billing until the janitor).",
        "leave the cluster running after the run (it bills!)",
        default=False,
        pipelines=_GKE_ONLY,
    ),
    RunParam(
        "keep_vm",
        "bool",
        "Keep the VM",
        SAFETY,
        "Leave both VMs running after the run (they keep billing until the janitor).",
        "leave both VMs running after the run (they bill!)",
        default=False,
        pipelines=_TPU_VM_ONLY,
    ),
    RunParam(
        "delete_bucket",
        "bool",
        "Delete the bucket",
        SAFETY,
        "Delete the bucket at teardown: this DELETES THE TRAINED MODEL. Off by default.",
        "delete the bucket **and every checkpoint and export in it** at teardown",
        default=False,
    ),
    RunParam(
        "hf_token_conn_id",
        "str",
        "HF token connection",
        MODEL,
        "Airflow connection holding the Hugging Face token (synced to Secret Manager).",
        "Airflow connection holding the HF token (password field)",
        default="huggingface_default",
        schema={"pattern": rules.CONN_ID.pattern},
        rule=rules.CONN_ID_RULE,
    ),
    RunParam(
        "hf_token_secret",
        "str",
        "HF token secret",
        MODEL,
        "Existing Secret Manager secret with the token; empty = sync from the connection.",
        "use this Secret Manager secret instead of syncing from the connection",
        nullable=True,
        schema={"pattern": optional(rules.SECRET_ID)},
        rule=rules.SECRET_ID_RULE,
        option="default_hf_token_secret",
        doc_default="empty",
    ),
    RunParam(
        "service_account",
        "str",
        "VM service account",
        CLOUD,
        "E-mail of the VM's service account (reads the HF token secret); empty = the default one.",
        "service account of both VMs; empty = the project's default compute account",
        nullable=True,
        pipelines=_TPU_VM_ONLY,
        schema={"pattern": optional(rules.SERVICE_ACCOUNT)},
        rule=rules.SERVICE_ACCOUNT_RULE,
        option=PerPipeline(None, "default_service_account"),
        doc_default="empty",
    ),
    RunParam(
        "cpu_machine_type",
        "str",
        "CPU VM machine type",
        VM,
        "Machine type of the CPU VM the checkpoint conversions run on (MaxText's converters run on the "
        "CPU only); 256 GB of RAM by default. Not a TPU (ct*) type; a series whose boot disk type is "
        "known: n1, n2, n2d, e2 (pd-balanced), n4, c3, c4 (hyperdisk-balanced).",
        "machine type of the CPU VM the conversions run on; a CPU type (a `ct…` one is refused) of a "
        "series with a known boot disk type (n1, n2, n2d, e2, n4, c3, c4)",
        default=CPU_VM_MACHINE_TYPE,
        pipelines=_TPU_VM_ONLY,
        schema={"pattern": SYSTEM_MACHINE_TYPE.pattern},
        rule="a CPU machine type like n2-highmem-32",
    ),
    RunParam(
        "authorized_cidr",
        "str",
        "Control-plane authorized network",
        CLUSTER,
        "CIDR of the GKE control plane's authorized networks: the addresses allowed to reach the "
        "cluster's Kubernetes API (kubectl, gcluster job). The default 0.0.0.0/0, as in the tutorials, "
        "opens it to the whole internet (still behind Google sign-in and IAM). Narrow it to the "
        "address range Airflow calls from: on Cloud Composer, the environment's egress range (its "
        "Cloud NAT addresses, or the workers' subnet range for a private IP environment), e.g. "
        "203.0.113.0/24.",
        "the GKE control plane's authorized networks: the CIDR allowed to reach the cluster's "
        "Kubernetes API (`kubectl`, `gcluster job`, and the job state and log reads of the workers and "
        "the triggerer). `0.0.0.0/0`, as in the tutorials, opens it to the whole internet (still "
        "behind Google sign-in and IAM); narrow it to where Airflow calls from — on Cloud Composer the "
        "environment's egress range (its Cloud NAT addresses, or the workers' subnet range for a "
        "private IP environment)",
        default="0.0.0.0/0",
        pipelines=_GKE_ONLY,
        schema={"minLength": 9},
        option="default_authorized_cidr",
    ),
    RunParam(
        "max_cluster_hours",
        "int",
        "Cluster lifetime (hours)",
        SAFETY,
        "Expiry label on the cluster: the tpu_rl_janitor DAG destroys it after this.",
        "expiry label read by `tpu_rl_janitor`; at least the stages' bounds (64 h by default)",
        default=72,
        pipelines=_GKE_ONLY,
        schema={"minimum": 1, "maximum": 24 * 14},
    ),
    RunParam(
        "max_vm_hours",
        "int",
        "VM lifetime (hours)",
        SAFETY,
        "Expiry label on both VMs: the tpu_rl_janitor DAG deletes them after this.",
        "expiry label read by `tpu_rl_janitor`; at least the stages' bounds (68 h by default); a "
        "flex-start VM's run duration",
        default=72,
        pipelines=_TPU_VM_ONLY,
        schema={"minimum": 1, "maximum": 24 * 7},
    ),
    RunParam(
        "runtime",
        "str",
        "TPU VM runtime",
        VM,
        "How the VMs run MaxText. container: both VMs run the prebuilt post-training image (the GKE "
        "jobs' image): the CPU VM converts and exports in it, the TPU VM trains in it (docker run "
        "--privileged), booted from a baked image that holds it (bake_image), so the billed TPU VM "
        "installs nothing. install: MaxText and its post-training extras are installed from sources "
        "on both VMs first, as in the tutorial (15-30 billed minutes on the TPU VM). One MaxText "
        "release per run either way.",
        "how the VMs run MaxText: `container` (both VMs run `workload_image`: the CPU VM converts and "
        "exports in it, the TPU VM trains in it, booted from the baked image of `bake_image` or pulling "
        "it: nothing is built on the billed TPU VM) or `install` (MaxText 0.2.3 and its post-training "
        "extras installed from sources on both VMs first, as in the tutorial: 15-30 billed minutes on "
        "the TPU VM); one MaxText release converts, trains and exports either way",
        default="container",
        pipelines=_TPU_VM_ONLY,
        schema={"enum": list(TPU_VM_RUNTIMES)},
    ),
    RunParam(
        "workload_image",
        "str",
        "Workload image",
        VM,
        "Container image training runs in with runtime container; empty = the tpu_post_training image "
        "the GKE pipeline uses. Ignored with runtime install.",
        "the image of `runtime: container`: a registry path, an optional `:tag` and an optional "
        "`@sha256:` digest; empty = the post-training image of the GKE jobs "
        "(`…/tpu_post_training:0.2.4`); unused with `install`",
        nullable=True,
        pipelines=_TPU_VM_ONLY,
        schema={"pattern": optional(rules.IMAGE)},
        rule=rules.IMAGE_RULE,
        doc_default="empty",
    ),
    RunParam(
        "bake_image",
        "bool",
        "Boot the TPU VM from a baked image",
        VM,
        "With runtime container: the TPU VM boots from a custom image holding Docker and the workload "
        "image (its image family is named after the image's digest), baked once on a CPU VM beside the "
        "conversion and reused by every later run until the image changes; install_maxtext then "
        "installs and pulls nothing on the billed TPU VM. Off: install_maxtext installs Docker and "
        "pulls the image on the TPU VM (about 6 billed minutes). Ignored with runtime install.",
        "with `runtime: container`, boot the TPU VM from a **baked image** holding Docker and "
        "`workload_image`: `bake_image` finds it in the image family named after the image's digest "
        "(`tpu-rl-sha256-<48 hex>`) or bakes it once on a CPU VM of its own (about 8 billed minutes "
        "of an `n2-standard-8`, beside the conversion), and `install_maxtext` installs and pulls "
        "nothing on the billed TPU VM; off: `install_maxtext` installs Docker and pulls the image on "
        "the TPU VM (about 6 billed TPU minutes a run); unused with `install`",
        default=True,
        pipelines=_TPU_VM_ONLY,
    ),
    RunParam(
        "cancel_previous_writer",
        "bool",
        "Stop an orphaned job on this run_name",
        SAFETY,
        "When run_name resumes a run whose worker crashed (its claim expired or its run ended) but "
        "whose job still trains or exports on its cluster or VM: stop that job and take its folder "
        "over. Off: this run refuses and names the job and how to stop it. A live run's job is never "
        "stopped.",
        "when `run_name` resumes a run whose worker crashed (its directory's claim expired or its run "
        "ended) but whose job still runs on its cluster or VM: stop that job (its JobSet; the VM's "
        "training container and MaxText processes), wait until nothing of it runs, then take the "
        "directory over. Off: the run refuses in one line naming the job and how to stop it. A live "
        "run's job is never stopped ([run safety](run-safety.md#run-identity-resume-and-one-job-per-directory))",
        default=False,
    ),
)

PARAMS_BY_KEY: Final[Mapping[str, RunParam]] = {param.key: param for param in RUN_PARAMS}


def params_of(pipeline: str) -> tuple[RunParam, ...]:
    """The rows of ``pipeline``'s conf, in the table's order."""
    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline must be one of {PIPELINES}, got {pipeline!r}")
    return tuple(param for param in RUN_PARAMS if pipeline in param.pipelines)


def defaults_of(pipeline: str) -> dict[str, Any]:
    """Every conf key of ``pipeline`` → its default (what the untouched form holds)."""
    return {param.key: param.default_on(pipeline) for param in params_of(pipeline)}


def environment_options_of(pipeline: str) -> dict[str, str]:
    """field → the ``[tpu_rl]`` option that prefills it on ``pipeline``."""
    found = {}
    for param in params_of(pipeline):
        option = param.option_on(pipeline)
        if option:
            found[param.key] = option
    return found


def placeholders_table() -> dict[str, tuple[Any, str]]:
    """field → (the form's example value, what to set instead): the examples ``validate`` refuses."""
    found: dict[str, tuple[Any, str]] = {}
    for param in RUN_PARAMS:
        if param.placeholder is None:
            continue
        values = {param.default_on(pipeline) for pipeline in param.pipelines}
        if len(values) != 1:
            raise ValueError(f"{param.key}: a placeholder has one example on every pipeline")
        found[param.key] = (values.pop(), param.placeholder)
    return found


def conf_kind(key: str) -> tuple[str, bool] | None:
    """``(kind, nullable)`` of a conf key, ``None`` for a key the table does not hold."""
    param = PARAMS_BY_KEY.get(key)
    return None if param is None else (param.kind, param.nullable)


def form_fields(pipeline: str) -> dict[str, dict[str, Any]]:
    """key → its form metadata on ``pipeline`` (``RunParam.form_field``), in the table's order."""
    return {param.key: param.form_field(pipeline) for param in params_of(pipeline)}


# The JSON-schema keywords of a field that a value of the right type can still break. Airflow checks
# each Param against its schema before any task runs and refuses with jsonschema's own message, the
# field's schema dumped after it over ~40 lines (3.3: Param.resolve in airflow/sdk/definitions/param.py
# and SerializedParam.resolve in airflow/serialization/definitions/param.py, which the REST API's
# trigger calls; 2.11: airflow/models/param.py; all raise ParamValidationError(err) of
# jsonschema.validate). The forms' Params leave these out (pipelines/form.py shows them as the
# field's rule, in words) and the spec, which checks every one of them, refuses in one line.
VALUE_RULES: Final = ("pattern", "propertyNames", "minimum", "maximum", "minLength", "maxLength")


def value_rule_words(metadata: Mapping[str, Any]) -> str:
    """A field's value rules (``VALUE_RULES``) in words, as the spec says them: its pattern's rule,
    its bounds, its length."""
    words = [metadata["rule"]] if metadata.get("rule") else []
    low, high = metadata.get("minimum"), metadata.get("maximum")
    if low is not None and high is not None:
        words.append(f"must be between {low} and {high}")
    elif low is not None or high is not None:
        words.append(f"must be >= {low}" if low is not None else f"must be <= {high}")
    shortest, longest = metadata.get("minLength"), metadata.get("maxLength")
    if shortest is not None and longest is not None:
        words.append(f"must be {shortest}-{longest} characters")
    elif shortest is not None or longest is not None:
        words.append(
            f"must be at least {shortest} characters"
            if shortest is not None
            else f"must be at most {longest} characters"
        )
    return "; ".join(words)
