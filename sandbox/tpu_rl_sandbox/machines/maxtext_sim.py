"""Simulated MaxText entry points: ``to_maxtext``, ``train_rl``, ``to_huggingface``.

Each reads its arguments the way MaxText does (``key=value`` config overrides checked against
the config keys of the MaxText release the machine runs, from the product's generated tables in
``airflow_provider_tpu_rl.maxtext.config_keys``, plus the script's own ``--flags``), reads
``HF_TOKEN`` from the environment, checks its inputs exist, prints MaxText/tunix-format log
lines and writes an output tree with the real layout: Orbax step directories as Orbax 0.12 writes
and finalizes them (``fsview.CheckpointWriter``), the arrays' folders and files as MaxText names
them, the Hugging Face export's files in MaxText's order (``hf_export``). Contents are small
made-up bytes; the structure is what matters. ``make test-maxtext`` runs MaxText's real converters
and writes their layouts to ``tests/fixtures/maxtext/real_layouts.json``, which
``tests/sandbox/test_maxtext_sim.py`` compares this simulation with.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from airflow_provider_tpu_rl.maxtext.config_keys import KEYS as MAXTEXT_CONFIG_KEYS
from airflow_provider_tpu_rl.spec.presets import GKE_MAXTEXT_VERSION
from tpu_rl_sandbox.machines import hf_export
from tpu_rl_sandbox.machines.fsview import (
    ORBAX_COMMIT_MARKER,
    CheckpointWriter,
    Router,
    StorageError,
    checkpoint_problem,
    join,
)
from tpu_rl_sandbox.world.faults import FaultSpec
from tpu_rl_sandbox.world.timescale import CONVERT, EXPORT, TRAIN, stage_seconds

TO_MAXTEXT = "maxtext.checkpoint_conversion.to_maxtext"
TRAIN_RL = "maxtext.trainers.post_train.rl.train_rl"
TO_HUGGINGFACE = "maxtext.checkpoint_conversion.to_huggingface"
MODULES = (TO_MAXTEXT, TRAIN_RL, TO_HUGGINGFACE)
# What train_rl ends with on a machine that has no TPU chips (a CPU VM): JAX cannot start the TPU
# backend the McJAX run asks for (jax._src.xla_bridge's "Unable to initialize backend" error).
NO_TPU_ERROR = (
    "Traceback (most recent call last):\n"
    "RuntimeError: Unable to initialize backend 'tpu': NOT_FOUND: No TPU devices found on this machine "
    "(set JAX_PLATFORMS='' to automatically choose an available backend)"
)
FAULT_KIND = {TO_MAXTEXT: "convert", TRAIN_RL: "train", TO_HUGGINGFACE: "export"}
# What initialize_jax_for_cpu reads with int(os.environ.get(...)) (maxtext-v0.2.3 max_utils.py).
XPK_CPU_VARIABLES = ("JOB_INDEX", "JOB_COMPLETION_INDEX", "PROCESSES_IN_JOB", "JAX_PROCESS_COUNT")

STEP_SECONDS_ENV = "TPU_RL_SANDBOX_STEP_SECONDS"
HOLD_FILE_ENV = "TPU_RL_SANDBOX_HOLD_FILE"
DEFAULT_STEP_SECONDS = 0.2

# The scripts' own flags (argparse in to_maxtext, absl in to_huggingface).
SCRIPT_FLAGS: dict[str, dict[str, str]] = {
    TO_MAXTEXT: {
        "lazy_load_tensors": "bool",
        "eager_load_method": "value",
        "hf_model_path": "value",
        "revision": "value",
        "save_dtype": "value",
        "simulated_cpu_devices_count": "value",
    },
    TO_HUGGINGFACE: {
        "override_model_architecture": "bool",
        "hf_model_path": "value",
        "parallel_threads": "value",
    },
    TRAIN_RL: {},
}
# Flags a release added: to_huggingface's --hf_model_path and --parallel_threads are absl flags of
# maxtext-v0.2.4 (to_huggingface.py l.112-125); v0.2.3 defines only --override_model_architecture
# (l.102) and absl refuses the others.
FLAGS_SINCE: dict[str, dict[str, str]] = {
    TO_HUGGINGFACE: {"hf_model_path": "0.2.4", "parallel_threads": "0.2.4"}
}

# MaxText's HF_IDS (utils/globals.py, maxtext-v0.2.3 and v0.2.4)
HF_IDS = {
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B-Thinking-2507",
    "gemma4-26b": "google/gemma-4-26b-a4b-it",
    "llama3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama3.1-8b-Instruct": "meta-llama/Llama-3.1-8B-Instruct",
}


class WorkloadFailed(Exception):
    """The simulated program stops with exit status 1 after printing ``lines`` (after a Python
    traceback's head, unless ``traceback`` is False: absl's flag errors print none)."""

    def __init__(self, *lines: str, traceback: bool = True) -> None:
        super().__init__(lines[-1] if lines else "failed")
        self.lines = lines
        self.traceback = traceback


class Preempted(Exception):
    """The machine under the workload was lost (preemption, node shutdown): nothing more runs."""


class Cancelled(Exception):
    """The job was cancelled while the program ran."""


@dataclass
class SimContext:
    """What a simulated program may touch."""

    router: Router
    write: Callable[[str], None]
    platform: str  # "gke" or "vm"
    seed: str
    # The MaxText release the machine runs (the tpu_post_training image's, or what pip installed).
    maxtext_version: str = GKE_MAXTEXT_VERSION
    fault: Callable[[str], FaultSpec | None] = lambda kind: None
    cancelled: Callable[[], bool] = lambda: False
    step_seconds: float = DEFAULT_STEP_SECONDS
    # The time scale (sandbox setting ``minute_seconds``): 0 = off, stages last a few steps.
    minute_seconds: float = 0.0
    # Stages' real minutes that replace the time scale's (sandbox setting ``stage_minutes``).
    stage_minutes: Mapping[str, float] = field(default_factory=dict)
    hold_file: str | None = None
    hold_seconds: float = 120.0  # the longest a hold lasts (settings.SandboxSettings.hold_seconds)
    # (run directory, its committed checkpoints, steps trained past the newest) -> the machine is
    # lost now
    preempt: Callable[[str, int, int], bool] = lambda run_dir, committed, past: False
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    # The machine's TPU chips as the program sees them (0: a CPU VM, a CPU node pool's pod, a
    # container without the host's devices); None where it is not modelled (a Pathways head, whose
    # JAX reaches the TPU through the proxy).
    tpu_chips: int | None = None


@dataclass
class MaxTextArgs:
    """Arguments as MaxText reads them."""

    module: str
    config: dict[str, str] = field(default_factory=dict)
    flags: dict[str, str] = field(default_factory=dict)
    config_file: str | None = None

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.config.get(key, default)

    def bool(self, key: str, default: bool) -> bool:
        value = self.config.get(key)
        if value is None:
            return default
        return value.strip().lower() in ("1", "true", "yes")

    def int(self, key: str, default: int) -> int:
        value = self.config.get(key)
        if value is None or value == "":
            return default
        try:
            return int(float(value))
        except ValueError:
            raise WorkloadFailed(
                f"pydantic_core._pydantic_core.ValidationError: {key}: Input should be a valid integer"
            ) from None


def context_from_env(env: dict[str, str]) -> tuple[float, str | None]:
    """Step duration and hold file from the sandbox's environment knobs."""
    try:
        step = float(env.get(STEP_SECONDS_ENV, "") or DEFAULT_STEP_SECONDS)
    except ValueError:
        step = DEFAULT_STEP_SECONDS
    return max(step, 0.0), env.get(HOLD_FILE_ENV) or None


# =============================================================================== formatting
def absl_line(level: str, source: str, message: str, now: float | None = None) -> str:
    """``I0102 03:04:05.678901 140000000000001 file.py:123] message`` (absl's format)."""
    moment = dt.datetime.fromtimestamp(now if now is not None else time.time(), dt.UTC)
    lineno = (sum(source.encode()) * 7) % 900 + 40
    return f"{level}{moment:%m%d %H:%M:%S.%f} {140234567890123:>15} {source}:{lineno}] {message}\n"


def _metric_line(
    prefix: str, corr: int, total: int, accuracy: float, partial: float, fmt: float, reward: float
) -> str:
    return (
        f"{prefix}: corr={corr}, total={total}, accuracy={accuracy}%, partial_accuracy={partial}%,"
        f" format_accuracy={fmt}%, mean_reward={reward:.4f}"
    )


# ================================================================================= argument
def config_keys_of(version: str) -> frozenset[str]:
    """The keys MaxText ``version``'s pyconfig accepts at the top level of its config."""
    keys = MAXTEXT_CONFIG_KEYS.get(version)
    if keys is None:
        raise WorkloadFailed(
            f"sandbox: no config key table for MaxText {version} (known: {', '.join(MAXTEXT_CONFIG_KEYS)}); "
            "the simulated MaxText cannot tell which keys it accepts"
        )
    return frozenset(keys)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def script_flags(module: str, maxtext_version: str) -> dict[str, str]:
    """The ``--flags`` of ``module`` in MaxText ``maxtext_version``, and their kind."""
    since = FLAGS_SINCE.get(module, {})
    return {
        name: kind
        for name, kind in SCRIPT_FLAGS[module].items()
        if name not in since or _release(maxtext_version) >= _release(since[name])
    }


def parse_args(module: str, argv: list[str], maxtext_version: str = GKE_MAXTEXT_VERSION) -> MaxTextArgs:
    """Split ``argv`` (after ``-m module``) into config overrides and script flags.

    A ``key=value`` whose key (for a dotted ``rl.num_generations``, its first part, the field
    OmegaConf nests it under) is not a config key of ``maxtext_version`` is refused the way
    pyconfig's ``_prepare_for_pydantic`` refuses it: a ``ValueError`` naming the valid fields.
    """
    args = MaxTextArgs(module)
    known = script_flags(module, maxtext_version)
    valid = config_keys_of(maxtext_version)
    index = 0
    while index < len(argv):
        item = argv[index]
        index += 1
        if item.startswith("--"):
            name, has_value, value = item[2:].partition("=")
            kind = known.get(name)
            if kind is None:
                raise WorkloadFailed(
                    f"FATAL Flags parsing error: Unknown command line flag '{name}'",
                    "Pass --helpshort or --helpfull to see help on flags.",
                    traceback=False,
                )
            if not has_value:
                if kind == "bool":
                    value = "true"
                elif index < len(argv):
                    value = argv[index]
                    index += 1
                else:
                    raise WorkloadFailed(f"error: argument --{name}: expected one argument")
            args.flags[name] = value
            continue
        if "=" in item:
            key, _, value = item.partition("=")
            head = key.split(".", 1)[0]
            if head not in valid:
                first = ", ".join(repr(name) for name in sorted(valid)[:2])
                raise WorkloadFailed(
                    f"ValueError: {head!r} not in {first}, ... ({len(valid)} valid config keys of "
                    f"MaxText {maxtext_version})."
                )
            args.config[key] = value
            continue
        if item.endswith((".yml", ".yaml")) and args.config_file is None and not args.config:
            args.config_file = item
            continue
        raise WorkloadFailed(f"ValueError: Invalid argument {item!r}: expected key=value.")
    return args


def _family(model_name: str) -> str:
    lowered = model_name.lower()
    for suffix in ("-instruct", "-it"):
        if lowered.endswith(suffix):
            lowered = lowered[: -len(suffix)]
    return lowered


# ==================================================================================== runner
class MaxTextRunner:
    """Runs one simulated MaxText program."""

    def __init__(self, ctx: SimContext, module: str, argv: list[str], env: dict[str, str]) -> None:
        self.ctx = ctx
        self.module = module
        self.argv = argv
        self.env = env
        self.rng = random.Random(hashlib.sha256(f"{ctx.seed}|{module}".encode()).hexdigest())
        self.script = {
            TO_MAXTEXT: "to_maxtext.py",
            TRAIN_RL: "train_rl.py",
            TO_HUGGINGFACE: "to_huggingface.py",
        }[module]

    # -- plumbing -------------------------------------------------------------------------
    def log(self, message: str, level: str = "I", source: str | None = None) -> None:
        self.ctx.write(absl_line(level, source or self.script, message, self.ctx.clock()))

    def raw(self, text: str) -> None:
        self.ctx.write(text if text.endswith("\n") else text + "\n")

    def wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            if self.ctx.cancelled():
                raise Cancelled()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.ctx.sleep(min(left, 0.05))

    def hold_before_commit(self) -> None:
        """Test hook: wait while the hold file exists (a step stays visibly in progress)."""
        if not self.ctx.hold_file:
            return
        deadline = time.monotonic() + self.ctx.hold_seconds
        while os.path.exists(self.ctx.hold_file) and time.monotonic() < deadline:
            if self.ctx.cancelled():
                raise Cancelled()
            self.ctx.sleep(0.02)

    def write_file(self, path: str, data: bytes) -> None:
        self.ctx.router.store(path).write(path, data)

    def run(self) -> int:
        try:
            self.dispatch()
        except WorkloadFailed as failure:
            if failure.traceback:
                self.raw("Traceback (most recent call last):")
                self.raw(f'  File "/deps/src/maxtext/{self.script}", line 1, in <module>')
            for line in failure.lines:
                self.raw(line)
            return 1
        except StorageError as error:
            self.raw("Traceback (most recent call last):")
            self.raw(f'  File "/deps/src/maxtext/{self.script}", line 1, in <module>')
            self.raw(str(error))
            return 1
        return 0

    def dispatch(self) -> None:
        args = parse_args(self.module, self.argv, self.ctx.maxtext_version)
        if "hf_access_token" in args.config:
            raise WorkloadFailed(
                "SandboxPolicyError: hf_access_token= was passed on the command line. The Hugging Face token "
                "would end up in the pod spec, `ps` and logs; export HF_TOKEN from Secret Manager instead."
            )
        model = args.get("model_name")
        if not model:
            raise WorkloadFailed("ValueError: model_name must be set (e.g. model_name=qwen3-30b-a3b).")
        self.initialize_jax_distributed_system(args)
        if self.module == TO_MAXTEXT:
            self.to_maxtext(args, model)
        elif self.module == TRAIN_RL:
            self.train_rl(args, model)
        else:
            self.to_huggingface(args, model)

    def initialize_jax_distributed_system(self, args: MaxTextArgs) -> None:
        """pyconfig's first step on a machine without TPU chips, as MaxText does it.

        ``max_utils.maybe_initialize_jax_distributed_system`` (maxtext-v0.2.3 l.234, v0.2.4 the
        same; pyconfig calls it before building the config) returns early for
        ``skip_jax_distributed_system``, ``enable_single_controller``, ``inference_benchmark_test``
        or ``compile_topology``. Otherwise ``hardware=cpu`` runs ``initialize_jax_for_cpu``, whose
        ``int(os.environ.get("JOB_INDEX"))`` fails outside XPK; the default ``hardware: 'tpu'``
        (base.yml l.469), with checkpointing on and ``compile_topology_num_slices`` -1, calls
        ``jax.distributed.initialize()``, and JAX finds no cluster: not a TPU VM, and on a GKE pod
        the K8s detection needs the ``kubernetes`` package, which the post-training image lacks
        (jax/_src/clusters/k8s_cluster.py ``is_env_present`` warns and returns False), so
        jax/_src/distributed.py raises ``coordinator_address should be defined.``
        """
        if self.ctx.tpu_chips != 0:
            return  # a TPU host: JAX finds its own cluster (or, under Pathways, needs none)
        if args.bool("skip_jax_distributed_system", False):
            self.log(
                "Skipping jax distributed system due to skip_jax_distributed_system=True flag.",
                source="max_utils.py",
            )
            return
        if args.bool("enable_single_controller", False):
            self.log(
                "Skipping jax distributed system since its not needed for single controller.",
                source="max_utils.py",
            )
            return
        if args.bool("inference_benchmark_test", False) or args.get("compile_topology"):
            self.log("Skipping jax distributed system initialization.", source="max_utils.py")
            return
        hardware = args.get("hardware", "tpu")
        if hardware == "cpu":
            self.log(
                "Attempting to initialize the jax distributed system for CPU backend...",
                source="max_utils.py",
            )
            self.log("Coordinator IP address: ", source="max_utils.py")
            missing = [name for name in XPK_CPU_VARIABLES if name not in self.env]
            if missing:
                raise WorkloadFailed(
                    '  File "/deps/src/maxtext/utils/max_utils.py", line 340, in initialize_jax_for_cpu',
                    "TypeError: int() argument must be a string, a bytes-like object or a real number, "
                    "not 'NoneType'",
                )
            raise WorkloadFailed(
                "sandbox: a multi-process CPU JAX cluster (initialize_jax_for_cpu with XPK's variables) is "
                "not simulated"
            )
        if hardware != "tpu":
            raise WorkloadFailed(f"sandbox: hardware={hardware} is not simulated (no GPUs here)")
        self.log(
            "Attempting to initialize the jax distributed system for TPU backend...", source="max_utils.py"
        )
        if args.bool("enable_multi_tier_checkpointing", False) or args.bool(
            "enable_emergency_checkpoint", False
        ):
            raise WorkloadFailed("sandbox: multi-tier and emergency checkpointing are not simulated")
        if args.bool("enable_checkpointing", True) and args.int("compile_topology_num_slices", -1) == -1:
            raise WorkloadFailed("ValueError: coordinator_address should be defined.")

    def require_token(self, repo: str) -> None:
        if not self.env.get("HF_TOKEN", "").strip():
            raise WorkloadFailed(
                f"huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-sandbox)\n"
                f"Cannot access gated repo for url https://huggingface.co/{repo}/resolve/main/config.json.\n"
                "Access to model is restricted. You must have access to it and be authenticated to access it. "
                "Please log in. (HF_TOKEN is empty or not set)"
            )

    def require_output_dir(self, args: MaxTextArgs) -> str:
        base = args.get("base_output_directory") or ""
        if not base:
            raise WorkloadFailed(
                "SandboxPolicyError: base_output_directory is not set; MaxText would write to a local "
                "maxtext_output/ folder that disappears with the machine."
            )
        if self.ctx.platform == "gke" and not base.startswith("gs://"):
            raise WorkloadFailed(
                f"SandboxPolicyError: base_output_directory={base} is on the pod's local disk, which is lost "
                "when the JobSet finishes; use a gs:// path."
            )
        if base.startswith("gs://"):
            bucket = base[len("gs://") :].split("/", 1)[0]
            if not self.ctx.router.gcs.bucket_exists(bucket):
                raise WorkloadFailed(
                    f"google.api_core.exceptions.NotFound: 404 GET https://storage.googleapis.com/storage/v1/b/{bucket}"
                    f": The specified bucket does not exist."
                )
        return base

    def check_fault(self, stage: str) -> None:
        spec = self.ctx.fault(FAULT_KIND[self.module])
        if spec is None:
            return
        if self.module == TRAIN_RL:
            message = (
                "jax.errors.JaxRuntimeError: UNAVAILABLE: The TPU slice became unhealthy (worker 3 lost); "
                "Pathways is restarting the slice."
                if spec.transient
                else "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Error allocating device buffer: "
                "Attempting to allocate 2.50G. That was not possible. There are 1.12G free."
            )
        elif spec.transient:
            message = (
                "huggingface_hub.errors.HfHubHTTPError: 503 Server Error: Service Unavailable for url: "
                f"https://huggingface.co/api/models ({stage})"
            )
        else:
            message = f"RuntimeError: Checkpoint conversion failed during {stage}: tensor shape mismatch."
        raise WorkloadFailed(message)

    def load_checkpoint(
        self, path: str, model: str, scan_layers: bool, *, reads_metadata_first: bool = False
    ) -> dict[str, object]:
        problem = checkpoint_problem(self.ctx.router, path, reads_metadata_first=reads_metadata_first)
        if problem:
            raise WorkloadFailed(problem)
        raw = self.ctx.router.store(path).read(join(path.rstrip("/"), "_METADATA")) or b"{}"
        try:
            metadata = json.loads(raw)
        except ValueError:
            metadata = {}
        written = metadata.get("sandbox", {}) if isinstance(metadata, dict) else {}
        if written.get("model_family") and written["model_family"] != _family(model):
            raise WorkloadFailed(
                "ValueError: User-provided restore item and on-disk value metadata tree structures do not match "
                f"(checkpoint was written for {written.get('model_name')}, loading as {model})."
            )
        if "scan_layers" in written and bool(written["scan_layers"]) != scan_layers:
            raise WorkloadFailed(
                "ValueError: User-provided restore item and on-disk value metadata tree structures do not match: "
                f"checkpoint has scan_layers={written['scan_layers']}, config has scan_layers={scan_layers}."
            )
        return written

    def check_write_access(self, directory: str) -> None:
        """MaxText's ``mkdir_and_check_permissions`` before a checkpoint manager is made
        (maxtext-v0.2.3 ``utils/gcs_utils.py`` l.279-318, ``common/checkpointing.py`` l.408): write
        ``<directory>/.write_test_<uuid4>`` and delete it (a failed delete is ignored)."""
        probe = join(directory, f".write_test_{uuid.UUID(int=self.rng.getrandbits(128), version=4)}")
        store = self.ctx.router.store(probe)
        try:
            store.write(probe, b"test")
        except StorageError as error:
            raise WorkloadFailed(
                str(error),
                "",
                "The above exception was the direct cause of the following exception:",
                "",
                f"PermissionError: Directory '{directory.rstrip('/')}' exists, but is not writable. "
                "Please check permissions.",
            ) from None
        with contextlib.suppress(StorageError):
            store.delete(probe)

    # -- Orbax trees ----------------------------------------------------------------------
    def _param_names(self, scan_layers: bool) -> list[str]:
        layers = ["decoder.layers"] if scan_layers else ["decoder.layers_0", "decoder.layers_1"]
        names = ["decoder.decoder_norm.scale", "token_embedder.embedding"]
        for layer in layers:
            names += [f"{layer}.self_attention.query.kernel", f"{layer}.mlp.wi_0.kernel"]
        return names

    def write_item(
        self,
        writer: CheckpointWriter,
        item: str,
        arrays: list[str],
        ocdbt: bool,
        zarr3: bool,
        meta: dict[str, object],
    ) -> None:
        """One PyTree item as Orbax's PyTreeCheckpointHandler writes it: ``array_metadatas/process_0``,
        the arrays (one folder each, ``.zarray`` and chunks; or OCDBT's ``ocdbt.process_0/`` and, merged,
        ``d/`` and ``manifest.ocdbt``), ``_sharding``, then ``_METADATA``."""
        tree = {name: {"value_type": "jax.Array", "skip_deserialize": False} for name in arrays}
        metadata = {"tree_metadata": tree, "use_zarr3": zarr3, "sandbox": meta}
        writer.write(
            item, "array_metadatas/process_0", json.dumps({"array_metadatas": sorted(arrays)}).encode()
        )

        def digest(text: str) -> str:
            return hashlib.md5(text.encode()).hexdigest()  # noqa: S324 (a file name)

        if ocdbt:
            for name in arrays:
                writer.write(item, f"ocdbt.process_0/d/{digest(f'{item}/{name}')}", self.rng.randbytes(64))
            writer.write(item, "ocdbt.process_0/manifest.ocdbt", b"OCDBT-MANIFEST")
        else:
            for name in arrays:
                if zarr3:
                    writer.write(
                        item, f"{name}/zarr.json", json.dumps({"zarr_format": 3, "shape": [4, 4]}).encode()
                    )
                    writer.write(item, f"{name}/c/0/0", self.rng.randbytes(32))
                else:
                    writer.write(
                        item, f"{name}/.zarray", json.dumps({"zarr_format": 2, "shape": [4, 4]}).encode()
                    )
                    writer.write(item, f"{name}/0.0", self.rng.randbytes(32))
        writer.write(
            item,
            "_sharding",
            json.dumps({name: {"sharding_type": "NamedSharding"} for name in arrays}).encode(),
        )
        writer.write(item, "_METADATA", json.dumps(metadata, sort_keys=True).encode())
        if ocdbt:
            writer.write(item, f"d/{digest(item)}", self.rng.randbytes(64))
            writer.write(item, "manifest.ocdbt", b"OCDBT-MANIFEST")

    def finish_step(self, writer: CheckpointWriter) -> None:
        writer.saved()
        self.hold_before_commit()
        writer.commit()

    # -- to_maxtext -----------------------------------------------------------------------
    def to_maxtext(self, args: MaxTextArgs, model: str) -> None:
        base = self.require_output_dir(args)
        repo = args.flags.get("hf_model_path") or HF_IDS.get(model, f"hf-org/{model}")
        scan_layers = args.bool("scan_layers", True)
        ocdbt = args.bool("checkpoint_storage_use_ocdbt", True)
        zarr3 = args.bool("checkpoint_storage_use_zarr3", True)
        self.log(
            f"Loading Hugging Face model {repo} (lazy_load_tensors={args.flags.get('lazy_load_tensors', 'True')})"
        )
        self.require_token(repo)
        total = stage_seconds(
            self.ctx.minute_seconds, model, CONVERT, self.ctx.step_seconds * 8, self.ctx.stage_minutes
        )
        self.wait(total / 4)
        self.log("Peak memory usage: 12.41 GB")
        self.check_fault("loading weights")
        layers = 4
        for layer in range(layers):
            self.wait(total / 8)
            self.raw(f"Converting layers: {int((layer + 1) * 100 / layers)}% | {layer + 1}/{layers}")
        step_dir = join(base, "0")
        self.log(f"Saving MaxText checkpoint to {join(step_dir, 'items')}")
        self.check_write_access(base)
        writer = CheckpointWriter(self.ctx.router, step_dir, self.ctx.clock)
        writer.begin(["items"])
        meta = {
            "model_name": model,
            "model_family": _family(model),
            "scan_layers": scan_layers,
            "producer": "to_maxtext",
        }
        # A TrainState's {"params": {"params": …}} and its step (utils.py maxtext-v0.2.3 l.1180-1182)
        arrays = ["step", *(f"params.params.{name}" for name in self._param_names(scan_layers))]
        self.write_item(writer, "items", arrays, ocdbt, zarr3, meta)
        self.wait(total / 4)
        self.finish_step(writer)
        self.log(f"Checkpoint saved at step 0 to {join(step_dir, 'items')}")
        self.log(f"Overall Elapse: {total / 60:.2f} min")

    # -- train_rl -------------------------------------------------------------------------
    def train_rl(self, args: MaxTextArgs, model: str) -> None:
        base = self.require_output_dir(args)
        load_path = args.get("load_parameters_path") or ""
        if not load_path:
            raise WorkloadFailed(
                "SandboxPolicyError: load_parameters_path is not set; RL would start from random weights."
            )
        scan_layers = args.bool("scan_layers", True)
        run_name = args.get("run_name") or f"{model}_{dt.datetime.now(dt.UTC):%Y-%m-%d-%H-%M}"
        num_batches = args.int("num_batches", 4)
        num_test_batches = args.int("num_test_batches", 5)
        period = args.int("checkpoint_period", 50)
        eval_interval = args.int("eval_interval", 10)
        batch_size = args.int("batch_size", 1)
        eval_batch = args.int("eval_batch_size", -1)
        total = num_test_batches * (eval_batch if eval_batch > 0 else batch_size)
        tokenizer = args.get("tokenizer_path") or HF_IDS.get(model, model)
        enable_checkpointing = args.bool("enable_checkpointing", True)
        # tunix's checkpoint manager picks its own handlers, whatever MaxText's checkpoint_storage_*
        # keys say: without OCDBT and zarr3 under Pathways (JAX_PLATFORMS holds "proxy"), Orbax's
        # defaults (OCDBT, zarr3) otherwise (google-tunix 0.1.7 sft/checkpoint_manager.py l.50-63).
        # The sandbox's Pathways head is the GKE pod whose chips are not modelled.
        pathways = "proxy" in self.env.get("JAX_PLATFORMS", "") or (
            self.ctx.platform == "gke" and self.ctx.tpu_chips is None
        )
        ocdbt = zarr3 = not pathways

        self.log(f"Loading tokenizer {tokenizer}", source="tokenizer.py")
        self.require_token(tokenizer)
        self.log(f"Loading checkpoint from {load_path}", source="checkpointing.py")
        self.load_checkpoint(load_path, model, scan_layers)
        if args.bool("debug", False):
            self.log("Train dataset samples:")
            self.log("Policy Model initialized successfully")
        actor_dir = join(base, run_name, "checkpoints", "actor")
        start = self.latest_committed_step(actor_dir, num_batches) if enable_checkpointing else 0
        if start:
            # tunix restores the newest committed step when the trainer is built (c4ec573
            # tunix/sft/checkpoint_manager.py l.292)
            self.log(
                f"Restored params from step: {start} in {0.5 + self.rng.random():.3f} seconds",
                source="checkpoint_manager.py",
            )

        pre = 0.08 + self.rng.random() * 0.1
        post = pre + 0.15 + self.rng.random() * 0.15

        def metrics(reward: float) -> tuple[int, float, float, float]:
            fraction = min(max(reward / 0.6, 0.0), 1.0)
            corr = round(total * fraction)
            accuracy = round(100.0 * corr / total, 4) if total else 0.0
            partial = round(min(100.0, accuracy + 5.0 + self.rng.random() * 5), 4)
            fmt = round(min(100.0, partial + 10.0 + self.rng.random() * 10), 4)
            return corr, accuracy, partial, fmt

        # One unit per step, two for the first evaluation, two for XLA's compilation: with the time
        # scale on, the whole run (start-up and every step) lasts the stage's minutes.
        unit = stage_seconds(
            self.ctx.minute_seconds,
            model,
            TRAIN,
            self.ctx.step_seconds * (num_batches + 4),
            self.ctx.stage_minutes,
        ) / (num_batches + 4)
        self.wait(unit * 2)
        if num_test_batches > 0:
            corr, acc, partial, fmt = metrics(pre)
            self.log(_metric_line("Pre RL Training", corr, total, acc, partial, fmt, pre), level="W")
        self.log("Starting RL training...", level="W")
        if start:
            # the data iterator is rebuilt from the start and the consumed batches skipped
            # (tunix/rl/rl_learner.py l.398-407; one micro-batch per step with num_iterations 1)
            self.log(f"Fast forwarded {start} micro-batches.", source="rl_learner.py")
        self.wait(unit * 2)  # XLA compilation pause
        wrote_checkpoint = False
        committed = len(self.committed_steps(actor_dir, num_batches)) if enable_checkpointing else 0
        newest = start
        for step in range(start + 1, num_batches + 1):
            self.wait(unit)
            self.log(f"Reshard finished in {0.8 + self.rng.random():.2f}s", source="reshard.py")
            loss = max(0.0005, 0.05 * (1 - step / (num_batches + 1)) + self.rng.random() * 0.01)
            self.log(
                f"Train step {step} training loss: {loss:f}  - training perplexity: {2.718281828**loss:f}",
                source="peft_trainer.py",
            )
            if num_test_batches > 0 and eval_interval > 0 and step % eval_interval == 0:
                reward = pre + (post - pre) * step / num_batches
                corr, acc, partial, fmt = metrics(reward)
                self.log(
                    _metric_line(f"Intermediate Eval (step={step})", corr, total, acc, partial, fmt, reward),
                    level="W",
                    source="hooks.py",
                )
            if enable_checkpointing and (step % period == 0 or step == num_batches):
                self.save_train_step(actor_dir, step, model, scan_layers, ocdbt, zarr3)
                wrote_checkpoint = True
                committed, newest = len(self.committed_steps(actor_dir, num_batches)), step
            if self.ctx.preempt(actor_dir, committed, step - newest):
                raise Preempted()
            if wrote_checkpoint:
                self.check_fault(f"step {step}")
        if not wrote_checkpoint and start == num_batches:
            self.check_fault(f"step {start}")
        self.log("RL Training Completed Successfully!", level="W")
        if num_test_batches > 0:
            corr, acc, partial, fmt = metrics(post)
            self.log(_metric_line("Post RL Training", corr, total, acc, partial, fmt, post), level="W")

    def latest_committed_step(self, actor_dir: str, limit: int) -> int:
        steps = self.committed_steps(actor_dir, limit)
        return max(steps) if steps else 0

    def committed_steps(self, actor_dir: str, limit: int) -> set[int]:
        """The steps committed in ``actor_dir`` (Orbax's rule: ``commit_success.txt`` on GCS, the
        finalized directory on a local disk), up to ``limit``."""
        store = self.ctx.router.store(actor_dir)
        steps: set[int] = set()
        for path in store.list_files(actor_dir):
            relative = path[len(actor_dir.rstrip("/")) + 1 :]
            first = relative.split("/", 1)[0]
            if not first.isdigit():
                continue
            step_dir = join(actor_dir, first)
            if actor_dir.startswith("gs://"):
                if relative == f"{first}/{ORBAX_COMMIT_MARKER}":
                    steps.add(int(first))
            elif relative == f"{first}/_CHECKPOINT_METADATA" and store.exists(
                join(step_dir, "_CHECKPOINT_METADATA")
            ):
                steps.add(int(first))
        return {s for s in steps if s <= limit}

    def save_train_step(
        self, actor_dir: str, step: int, model: str, scan_layers: bool, ocdbt: bool, zarr3: bool
    ) -> None:
        step_dir = join(actor_dir, str(step))
        self.log(f"Saving checkpoint for step {step} to {step_dir}", source="checkpoint_manager.py")
        writer = CheckpointWriter(self.ctx.router, step_dir, self.ctx.clock)
        writer.begin(["model_params", "optimizer_state"])
        meta = {
            "model_name": model,
            "model_family": _family(model),
            "scan_layers": scan_layers,
            "producer": "train_rl",
            "step": step,
        }
        # tunix's items: nnx.state(model), the actor's params under "base", and the optimizer's state
        # (google-tunix 0.1.7 sft/checkpoint_manager.py l.91-143), each leaf a ".value"
        names = self._param_names(scan_layers)
        self.write_item(writer, "model_params", [f"base.{n}.value" for n in names], ocdbt, zarr3, meta)
        self.wait(self.ctx.step_seconds / 2)
        optimizer = [*(f"opt_state.0.mu.base.{n}.value" for n in names[:2]), "step.value"]
        self.write_item(writer, "optimizer_state", optimizer, ocdbt, zarr3, meta)
        self.finish_step(writer)
        self.log(f"Finished saving checkpoint for step {step}.", source="checkpoint_manager.py")

    # -- to_huggingface -------------------------------------------------------------------
    def to_huggingface(self, args: MaxTextArgs, model: str) -> None:
        load_path = args.get("load_parameters_path") or ""
        if not load_path:
            raise WorkloadFailed(
                "ValueError: load_parameters_path must be set to the MaxText checkpoint to export."
            )
        base = self.require_output_dir(args)
        if model not in hf_export.MODELS:
            # HF_MODEL_CONFIGS[model_key] (to_huggingface.py maxtext-v0.2.4 l.521)
            raise WorkloadFailed(f"KeyError: '{model}'")
        scan_layers = args.bool("scan_layers", True)
        repo = args.flags.get("hf_model_path") or HF_IDS.get(model, f"hf-org/{model}")
        self.log(f"Loading MaxText checkpoint from {load_path}")
        self.load_checkpoint(load_path, model, scan_layers, reads_metadata_first=True)
        self.log(f"Loading tokenizer from {repo}")
        self.require_token(repo)
        total = stage_seconds(
            self.ctx.minute_seconds, model, EXPORT, self.ctx.step_seconds * 8, self.ctx.stage_minutes
        )
        self.wait(total / 4)
        self.check_fault("weight conversion")
        files = hf_export.export_files(model, self.ctx.maxtext_version, self.rng)
        weights = [name for name, _ in files if name.endswith(".safetensors")]
        for name, data in files:
            if name in weights:
                self.wait(total / (2 * len(weights)))
            self.write_file(join(base, name), data)
            if name in weights:
                done = weights.index(name) + 1
                self.raw(f"Saving shards: {int(done * 100 / len(weights))}% | {done}/{len(weights)}")
        self.log(f"Hugging Face model saved to {base}")


def run(module: str, argv: list[str], env: dict[str, str], ctx: SimContext) -> int:
    """Run ``python3 -m <module> <argv>``; returns the exit status."""
    return MaxTextRunner(ctx, module, argv, env).run()
