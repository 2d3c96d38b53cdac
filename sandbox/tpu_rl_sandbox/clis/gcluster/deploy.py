"""``gcluster create|deploy|destroy``: blueprint expansion, deployment folder, Terraform simulation.

Follows Cluster Toolkit (cmd/create.go, cmd/deploy.go, cmd/destroy.go, pkg/shell/terraform.go,
pkg/config/expand.go): the deployment folder ``<out>/<deployment_name>/`` with ``.ghpc/artifacts/
expanded_blueprint.yaml`` and one folder per group; Terraform state local to the group folder
(``<group>/terraform.tfstate``) unless ``--backend-config`` set a GCS backend, whose default prefix
is ``<blueprint_name>/<deployment_name>/<group>`` (object ``<prefix>/default.tfstate``). The
"real world" (clusters, service accounts) lives in the sandbox state, so Terraform's view and
reality can disagree exactly as they do with a lost local state.

``$(ghpc_stage("./file"))`` values are resolved against the blueprint's folder and copied to
``<deployment>/.ghpc/staged/`` (pkg/config/staging.go, pkg/modulewriter/modulewriter.go), and the
first ``terraform init`` of a group needs ``git`` on PATH (the registry modules are git sources).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpu_rl_sandbox.apis.gcs_client import GcsApi, GcsError
from tpu_rl_sandbox.clis.gcluster.console import Console, Fatal
from tpu_rl_sandbox.clis.gcluster.dependencies import VERSION as PINNED_VERSION
from tpu_rl_sandbox.clis.gcluster.gotime import go_quote

# yaml is imported by the functions that read or write YAML: each fake call is a new interpreter,
# and `gcluster job` commands need none of it.
from tpu_rl_sandbox.world import capacity, gke_nodes, inventory
from tpu_rl_sandbox.world.faults import FaultGate
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.store import StateStore
from tpu_rl_sandbox.world.timescale import capacity_seconds, drain_seconds
from tpu_rl_sandbox.world.timestamps import rfc3339

LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
SA_ACCOUNT_ID_RE = re.compile(r"^[a-z](?:[-a-z0-9]{4,28}[a-z0-9])$")
VAR_REF_RE = re.compile(r"\$\(vars\.([A-Za-z_][A-Za-z0-9_]*)\)")
# $(ghpc_stage("./file")) with a string literal (pkg/config/staging.go evaluates the call)
GHPC_STAGE_RE = re.compile(r'\$\(\s*ghpc_stage\(\s*"((?:[^"\\]|\\.)*)"\s*\)\s*\)')
# pkg/config/staging.go StagingDir: relative to a deployment group's folder
STAGING_DIR = "../.ghpc/staged"
TERRAFORM_VERSION = "1.12.2"
VALIDATION_HELP = """One or more blueprint validators has failed. See messages above for suggested
actions. General troubleshooting guidance and instructions for configuring validators are shown below.

- https://goo.gle/hpc-toolkit-troubleshooting
- https://goo.gle/hpc-toolkit-validation

Validators can be silenced or treated as warnings or errors:

- https://goo.gle/hpc-toolkit-validation-levels
"""


class PromptExit(Fatal):
    """``logging.Fatal``/``ExitWithCode`` from the approval prompt: ends the process at once."""


def hint_error(message: str, hint: str) -> Fatal:
    return Fatal(f"Error: {message}\nHint: {hint}")


# ================================================================================ blueprint
def _substitute(value: Any, variables: dict[str, Any]) -> Any:
    if isinstance(value, str):
        whole = VAR_REF_RE.fullmatch(value.strip())
        if whole and whole.group(1) in variables:
            return copy.deepcopy(variables[whole.group(1)])
        return VAR_REF_RE.sub(lambda m: str(variables.get(m.group(1), m.group(0))), value)
    if isinstance(value, list):
        return [_substitute(item, variables) for item in value]
    if isinstance(value, dict):
        return {key: _substitute(item, variables) for key, item in value.items()}
    return value


def load_blueprint(path: Path) -> dict[str, Any]:
    import yaml

    try:
        text = path.read_text()
    except OSError as error:
        raise Fatal(f"Error: failed to read the input yaml, filename={path}: {error.strerror}") from None
    try:
        blueprint = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise Fatal(f"Error: failed to decode blueprint {path}: {error}") from None
    if not isinstance(blueprint, dict):
        raise Fatal(f"Error: failed to decode blueprint {path}: the blueprint must be a YAML mapping")
    return blueprint


def yaml_scalar(text: str) -> Any:
    """How gcluster reads ``--vars k=v`` values: YAML, so ``1`` is a number and ``''`` is null."""
    import yaml

    try:
        return yaml.safe_load(text) if text != "" else None
    except yaml.YAMLError:
        raise Fatal(
            f"Failed to set the variables at CLI: invalid input: unable to convert value '{text}' to known type"
        ) from None


def expand_blueprint(
    blueprint: dict[str, Any],
    cli_vars: list[str],
    backend_config: list[str],
    deployment_file: str | None,
    validation_level: str,
) -> dict[str, Any]:
    """Apply ``-d``, ``--vars`` and ``--backend-config`` and expand ``$(vars.x)`` references."""
    bp = copy.deepcopy(blueprint)
    name = bp.get("blueprint_name")
    if not isinstance(name, str) or not name:
        raise Fatal('Error: blueprint_name: invalid value for "blueprint_name": value is an empty string')
    if not LABEL_VALUE_RE.match(name):
        raise Fatal(
            'Error: blueprint_name: invalid value for "blueprint_name": value can only contain lowercase letters, '
            "numeric characters, underscores and dashes, and must be between 0 and 63 characters long"
        )
    groups = bp.get("deployment_groups")
    if not isinstance(groups, list) or not groups:
        raise Fatal("Error: deployment_groups: the blueprint must have at least one deployment group")
    for group in groups:
        if not isinstance(group, dict) or not group.get("group"):
            raise Fatal("Error: group name must be set for each deployment group")
        if not isinstance(group.get("modules"), list) or not group["modules"]:
            raise Fatal(f"Error: deployment group {group['group']} must have at least one module")
    check_intergroup_order(groups)
    variables = bp.get("vars") or {}
    if not isinstance(variables, dict):
        raise Fatal("Error: vars: must be a mapping")
    if deployment_file:
        settings = load_blueprint(Path(deployment_file))
        variables.update(settings.get("vars") or {})
        if settings.get("terraform_backend_defaults"):
            bp["terraform_backend_defaults"] = settings["terraform_backend_defaults"]
    for item in cli_vars:
        key, sep, raw = item.partition("=")
        if not sep:
            raise Fatal(
                f"Failed to set the variables at CLI: invalid format: '{item}' should follow the 'name=value' format"
            )
        variables[key] = yaml_scalar(raw)
    if backend_config:
        cli_backend: dict[str, Any] = {"type": "gcs", "configuration": {}}
        for item in backend_config:
            key, sep, value = item.partition("=")
            if not sep:
                raise Fatal(
                    f"Failed to set the backend config at CLI: invalid format: '{item}' should follow the 'name=value' format"
                )
            if key == "type":
                cli_backend["type"] = value
            else:
                cli_backend["configuration"][key] = value
        bp["terraform_backend_defaults"] = cli_backend
    if validation_level not in ("ERROR", "WARNING", "IGNORE"):
        raise Fatal('Error: invalid validation level ("ERROR", "WARNING", "IGNORE")')
    bp["validation_level"] = validation_level
    deployment = variables.get("deployment_name")
    if "deployment_name" not in variables:
        raise Fatal(
            'Error: vars.deployment_name: invalid value for "deployment_name": could not find source of variable'
        )
    if not isinstance(deployment, str):
        raise Fatal(
            'Error: vars.deployment_name: invalid value for "deployment_name": value was not of type string'
        )
    if not deployment:
        raise Fatal(
            'Error: vars.deployment_name: invalid value for "deployment_name": value is an empty string'
        )
    if not LABEL_VALUE_RE.match(deployment):
        raise Fatal(
            'Error: vars.deployment_name: invalid value for "deployment_name": value can only contain lowercase '
            "letters, numeric characters, underscores and dashes, and must be between 0 and 63 characters long"
        )
    # pkg/config/validate.go validateVars (v1.95.0): a var left null (``reservation:`` with no
    # value; yaml.go reads it as a null, yaml_test.go TestDictUnmarshalYAML) is refused.
    unset = [
        f'vars.{key}: deployment variable "{key}" was not set'
        for key, value in variables.items()
        if value is None
    ]
    if len(unset) == 1:
        raise Fatal(f"Error: {unset[0]}")
    if unset:
        raise Fatal("".join(f"Error: {error}\n" for error in unset))
    labels = dict(variables.get("labels") or {})
    labels.setdefault("ghpc_blueprint", name)
    labels.setdefault("ghpc_deployment", deployment)
    variables["labels"] = labels
    bp["vars"] = variables
    defaults = bp.get("terraform_backend_defaults")
    for group in groups:
        group["modules"] = [
            {**module, "settings": _substitute(module.get("settings") or {}, variables)}
            for module in group["modules"]
        ]
        backend: dict[str, Any] | None = group.get("terraform_backend") or (
            copy.deepcopy(defaults) if defaults else None
        )
        if backend and backend.get("type") == "gcs":
            configuration = backend.setdefault("configuration", {})
            configuration.setdefault("prefix", f"{name}/{deployment}/{group['group']}")
        if backend:
            group["terraform_backend"] = backend
    return bp


# pkg/config/errors.go errMsgIntergroupOrder
INTERGROUP_ORDER = "references to outputs from other groups must be to earlier groups"
_EXPRESSION_RE = re.compile(r"\$\(([^)]*)\)")
_MODULE_REF_RE = re.compile(r"\b([A-Za-z][A-Za-z0-9_-]*)\.[A-Za-z_][A-Za-z0-9_]*")


def module_references(module: dict[str, Any]) -> set[str]:
    """The names a module refers to as modules: its ``use`` list and ``name.output`` in the
    ``$(...)`` expressions of its settings (``vars.x`` is a variable)."""
    found = {str(u) for u in module.get("use") or []}

    def walk(value: Any) -> None:
        if isinstance(value, str):
            for expression in _EXPRESSION_RE.findall(value):
                found.update(n for n in _MODULE_REF_RE.findall(expression) if n != "vars")
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(module.get("settings") or {})
    return found


def module_groups(groups: list[dict[str, Any]]) -> dict[str, int]:
    """Module id → index of its deployment group."""
    return {
        str(module.get("id")): index
        for index, group in enumerate(groups)
        for module in group.get("modules") or []
        if isinstance(module, dict)
    }


def check_intergroup_order(groups: list[dict[str, Any]]) -> None:
    """pkg/config/expand.go ``validateModuleReference``: a module may use (or read the outputs of)
    a module of its own group or of an earlier one, never of a later one."""
    where = module_groups(groups)
    for index, group in enumerate(groups):
        for module in group.get("modules") or []:
            for name in sorted(module_references(module)):
                if where.get(name, -1) > index:
                    raise Fatal(f"Error: {INTERGROUP_ORDER}: {name} is in a later group")


def upstream_groups(bp: dict[str, Any], group: dict[str, Any]) -> list[str]:
    """The earlier groups whose outputs ``group`` reads (config.OutputNamesByGroup)."""
    groups = bp["deployment_groups"]
    where = module_groups(groups)
    index = next(i for i, g in enumerate(groups) if g["group"] == group["group"])
    used = {where[name] for m in group["modules"] for name in module_references(m) if name in where}
    return [str(groups[i]["group"]) for i in sorted(used) if i < index]


def missing_upstream_outputs(depl: Path, bp: dict[str, Any], group: dict[str, Any]) -> str | None:
    """pkg/shell/terraform.go ``gatherUpstreamOutputs``: the first earlier group whose outputs
    file (``.ghpc/artifacts/<group>_outputs.tfvars``, written by deploy or ``export-outputs``) is
    missing, or None."""
    for name in upstream_groups(bp, group):
        if not (_artifacts(depl) / f"{name}_outputs.tfvars").is_file():
            return name
    return None


def run_validators(bp: dict[str, Any], console: Console) -> None:
    """The project/region/zone validators (skipped with ``-l IGNORE``)."""
    level = bp.get("validation_level", "ERROR")
    if level == "IGNORE":
        return
    variables = bp["vars"]
    problems = []
    for key in ("project_id", "region", "zone"):
        if not variables.get(key):
            problems.append(
                f'validator "test_{"project_exists" if key == "project_id" else key + "_exists"}" failed:\n'
                f"Error: {key} must be set to a non-empty value"
            )
    region, zone = variables.get("region"), variables.get("zone")
    if region and zone and not str(zone).startswith(f"{region}-"):
        problems.append(
            f'validator "test_zone_in_region" failed:\nError: zone {zone} is not in region {region}'
        )
    if not problems:
        return
    for problem in problems:
        console.error(problem + "\n")
    console.error(VALIDATION_HELP)
    if level == "ERROR":
        raise Fatal("Validation failed due to the issues listed above")
    console.error("Validation failures were treated as a warning, continuing to create blueprint.\n")


# ================================================================================== staging
def _go_base(path: str) -> str:
    """Go's ``filepath.Base``."""
    if path == "":
        return "."
    stripped = path.rstrip("/")
    return "/" if stripped == "" else stripped.rsplit("/", 1)[-1]


def staged_destination(src: str) -> str:
    """``makeGhpcStageImpl`` (pkg/config/staging.go): ``../.ghpc/staged/<base>_<md5(src)[:10]>``."""
    digest = hashlib.md5(src.encode(), usedforsecurity=False).hexdigest()[:10]
    name = _go_base(src)
    if name in (".", "..", "/"):
        name = "file"
    return os.path.normpath(os.path.join(STAGING_DIR, f"{name}_{digest}"))


def _walk_strings(value: Any, visit: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return visit(value)
    if isinstance(value, list):
        return [_walk_strings(item, visit) for item in value]
    if isinstance(value, dict):
        return {key: _walk_strings(item, visit) for key, item in value.items()}
    return value


def _unescape(literal: str) -> str:
    return re.sub(r"\\(.)", r"\1", literal)


def evaluate_ghpc_stage(bp: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``Materialize``'s ``ghpc_stage`` evaluation: the blueprint with each call replaced by its
    staged path, and ``{src: staged path}`` (pkg/config/staging.go, ``stagedFiles``)."""
    staged: dict[str, str] = {}

    def visit(text: str) -> str:
        def replace(match: re.Match[str]) -> str:
            src = _unescape(match.group(1))
            staged[src] = staged_destination(src)
            return staged[src]

        return GHPC_STAGE_RE.sub(replace, text)

    result = copy.deepcopy(bp)
    result["vars"] = _walk_strings(result.get("vars") or {}, visit)
    for group in result.get("deployment_groups") or []:
        for module in group.get("modules") or []:
            module["settings"] = _walk_strings(module.get("settings") or {}, visit)
    return result, staged


def stage_files(
    depl: Path, staged: dict[str, str], blueprint_arg: str, cwd: Path, console: Console | None
) -> None:
    """pkg/modulewriter/modulewriter.go ``stageFiles``: copy each staged file next to the groups.

    A relative ``src`` is resolved against the folder of the blueprint as given on the command
    line (``StagedFiles``); missing both there and as a previous staged copy is an error.
    """
    if not staged:
        return
    (depl / ".ghpc" / "staged").mkdir(mode=0o700, parents=True, exist_ok=True)
    errors: list[str] = []
    for src, rel in staged.items():
        abs_src = (
            src if os.path.isabs(src) else os.path.normpath(os.path.join(os.path.dirname(blueprint_arg), src))
        )
        on_disk = Path(abs_src) if os.path.isabs(abs_src) else cwd / abs_src
        dst = Path(os.path.normpath(depl / "any_group_dir" / rel))
        src_exists, dst_exists = os.path.lexists(on_disk), os.path.lexists(dst)
        if not src_exists and not dst_exists:
            errors.append(f"file for staging {abs_src} does not exists")
        elif not src_exists:
            if console is not None:
                console.error(
                    f"WARNING: file {abs_src} does not exists, proceeding by using previously staged copy"
                )
        elif on_disk.is_dir():
            shutil.copytree(on_disk, dst, dirs_exist_ok=True)
        else:
            shutil.copy(on_disk, dst)
    if len(errors) == 1:
        raise Fatal(f"Error: {errors[0]}")
    if errors:
        raise Fatal("".join(f"Error: {error}\n" for error in errors))


# ============================================================================ the deployment
def group_names(bp: dict[str, Any]) -> list[str]:
    return [str(group["group"]) for group in bp["deployment_groups"]]


def _artifacts(depl: Path) -> Path:
    return depl / ".ghpc" / "artifacts"


def check_overwrite_allowed(
    depl: Path, bp: dict[str, Any], overwrite: bool, force: bool, display: str
) -> None:
    if not depl.exists() or force:
        return
    if not (depl / ".ghpc").is_dir():
        raise hint_error(
            f"folder {go_quote(display)} already exists, and it is not a valid GHPC deployment folder",
            "Use `--force` to overwrite the deployment anyway. Proceed at your own risk.",
        )
    expanded = _artifacts(depl) / "expanded_blueprint.yaml"
    if not expanded.is_file():
        raise hint_error(
            f"expanded blueprint file {go_quote(os.path.join(display, '.ghpc', 'artifacts', 'expanded_blueprint.yaml'))} is missing, this could be a result of changing GHPC "
            "version between consecutive deployments",
            "Use `--force` to overwrite the deployment anyway. Proceed at your own risk.",
        )
    if not overwrite:
        raise hint_error(f"deployment folder {go_quote(display)} already exists", "use -w to overwrite")
    previous = load_blueprint(expanded)
    for name in group_names(previous):
        if name not in group_names(bp):
            raise hint_error(
                f"you are attempting to remove a deployment group {go_quote(name)}, which is not supported",
                "Use `--force` to overwrite the deployment anyway. Proceed at your own risk.",
            )


def _hcl(value: Any) -> str:
    return json.dumps(value)


def _release_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


# pkg/modulewriter/modulewriter.go: embedded modules shared in <deployment>/_modules/embedded/ from
# v1.91.0 (copySharedEmbeddedModules, #5625/#5627), in each <group>/modules/embedded/ before
# (DeploymentSource at v1.90.0).
SHARED_MODULES_RELEASE = (1, 91, 0)
# modules/management/kubectl-apply/kueue/ at each release (git ls-tree): pathways.yaml.tftpl up to
# v1.91.0; kueue-configuration-pathways.yaml.tftpl (#5628, 962b1d303) from v1.92.0 on.
KUEUE_DEFAULT_TEMPLATE = "kueue-configuration-pathways.yaml.tftpl"
KUEUE_DEFAULT_RELEASE = (1, 92, 0)
KUEUE_OLD_PATHWAYS_TEMPLATE = "pathways.yaml.tftpl"
# variables.tf declares enable_pathways_for_tpus (which the blueprint's var of that name sets) from
# v1.91.0; before, only kueue.enable_pathways_for_tpus turns the Pathways queue on.
KUBECTL_PATHWAYS_VARIABLE_RELEASE = (1, 91, 0)
KUBECTL_APPLY = "modules/management/kubectl-apply"


def embedded_module_dir(depl: Path, group: str, source: str, release: str) -> Path:
    """Where ``create`` writes an embedded module at ``release`` (modulewriter, above)."""
    if _release_tuple(release) >= SHARED_MODULES_RELEASE:
        return depl / "_modules" / "embedded" / source
    return depl / group / "modules" / "embedded" / source


def write_embedded_modules(depl: Path, bp: dict[str, Any], release: str) -> None:
    """The blueprint's embedded modules (sources under ``modules/``/``community/modules/``) as
    stand-ins: a ``main.tf`` stub each; kubectl-apply with its ``kueue/`` files of ``release``
    (their contents are stand-ins, not the release's files) and, from v1.91.0, its module-level
    ``enable_pathways_for_tpus`` variable."""
    version = _release_tuple(release)
    for group in bp["deployment_groups"]:
        for module in group["modules"]:
            source = str(module.get("source", ""))
            if not (source.startswith("modules/") or source.startswith("community/modules/")):
                continue
            folder = embedded_module_dir(depl, str(group["group"]), source, release)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "main.tf").write_text("# sandbox stand-in of the embedded module\n")
            if source != KUBECTL_APPLY:
                continue
            kueue = folder / "kueue"
            kueue.mkdir(exist_ok=True)
            (kueue / "kueue-helm-values.yaml").write_text("# sandbox stand-in\n")
            name = KUEUE_DEFAULT_TEMPLATE if version >= KUEUE_DEFAULT_RELEASE else KUEUE_OLD_PATHWAYS_TEMPLATE
            (kueue / name).write_text("# sandbox stand-in: cluster_queue() models what it applies\n")
            if version >= KUBECTL_PATHWAYS_VARIABLE_RELEASE:
                (folder / "variables.tf").write_text('variable "enable_pathways_for_tpus" {}\n')


def kubectl_apply_copy(group_dir: Path) -> Path | None:
    """The kubectl-apply module a group's Terraform reads (either layout), or None."""
    for folder in (
        group_dir.parent / "_modules" / "embedded" / KUBECTL_APPLY,
        group_dir / "modules" / "embedded" / KUBECTL_APPLY,
    ):
        if folder.is_dir():
            return folder
    return None


def write_deployment(
    depl: Path,
    bp: dict[str, Any],
    blueprint_arg: str = "",
    cwd: Path | None = None,
    console: Console | None = None,
    release: str = "",
) -> None:
    """The deployment folder as modulewriter lays it out (Terraform files are simplified).

    ``blueprint_arg`` is the blueprint path as given on the command line: ``ghpc_stage`` files
    are resolved against its folder and copied to ``.ghpc/staged`` (``WriteDeployment``).
    ``release``: the gcluster release played, whose embedded modules are written.
    """
    import yaml

    expanded = bp
    bp, staged = evaluate_ghpc_stage(bp)
    ghpc = depl / ".ghpc"
    fresh = not depl.exists()
    depl.mkdir(parents=True, exist_ok=True)
    ghpc.mkdir(parents=True, exist_ok=True)
    if fresh:
        (depl / ".gitignore").write_text("# Ignore Terraform state and plans\n.terraform/\n*.tfstate*\n")
    artifacts = _artifacts(depl)
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir(parents=True)
    (artifacts / "DO_NOT_MODIFY_THIS_DIRECTORY").write_text(
        "Files in this directory are managed by gcluster. Do not modify them manually!\n"
    )
    previous = ghpc / "previous_deployment_groups"
    shutil.rmtree(previous, ignore_errors=True)
    previous.mkdir()
    for child in depl.iterdir():
        if child.is_dir() and child.name != ".ghpc":
            child.rename(previous / child.name)
    stage_files(depl, staged, blueprint_arg, cwd or Path.cwd(), console)
    instructions = ["Advanced Deployment Instructions", "================================", ""]
    for group in bp["deployment_groups"]:
        gdir = depl / str(group["group"])
        gdir.mkdir()
        lines = []
        backend = group.get("terraform_backend")
        if backend:
            lines.append("terraform {")
            lines.append(f'  backend "{backend["type"]}" {{')
            for key, value in sorted(backend.get("configuration", {}).items()):
                lines.append(f"    {key} = {_hcl(value)}")
            lines += ["  }", "}", ""]
        for module in group["modules"]:
            lines.append(f'module "{module["id"]}" {{')
            lines.append(f'  source = "./modules/embedded/{module.get("source", "")}"')
            for key, value in sorted((module.get("settings") or {}).items()):
                lines.append(f"  {key} = {_hcl(value)}")
            lines += ["}", ""]
        (gdir / "main.tf").write_text("\n".join(lines))
        variables = bp["vars"]
        (gdir / "variables.tf").write_text(
            "".join(f'variable "{k}" {{\n  type = any\n}}\n\n' for k in sorted(variables))
        )
        (gdir / "terraform.tfvars").write_text(
            "".join(f"{k} = {_hcl(v)}\n" for k, v in sorted(variables.items()))
        )
        (gdir / "providers.tf").write_text(
            'provider "google" {\n  project = var.project_id\n  region  = var.region\n  zone    = var.zone\n}\n'
        )
        (gdir / "versions.tf").write_text(
            f'terraform {{\n  required_version = ">= {TERRAFORM_VERSION}"\n}}\n'
        )
        (gdir / "outputs.tf").write_text("")
        old_state = previous / str(group["group"]) / "terraform.tfstate"
        if old_state.is_file():
            shutil.copy2(old_state, gdir / "terraform.tfstate")
        instructions += [
            f"Deployment group {group['group']}:",
            f"  terraform -chdir={gdir} init",
            f"  terraform -chdir={gdir} apply",
            "",
        ]
    write_embedded_modules(depl, bp, release or PINNED_VERSION)
    instructions += [
        "Destroying infrastructure when no longer needed",
        "===============================================",
        "",
    ]
    instructions.append(f"gcluster destroy {depl}")
    (depl / "instructions.txt").write_text("\n".join(instructions) + "\n")
    (artifacts / "expanded_blueprint.yaml").write_text(yaml.safe_dump(expanded, sort_keys=False))


# ================================================================================ Terraform
class TerraformState:
    """The state of one deployment group, in GCS (backend ``gcs``) or the group folder."""

    def __init__(
        self,
        group_dir: Path,
        backend: dict[str, Any] | None,
        api: GcsApi,
        shown: str = "",
        path: str | None = None,
    ) -> None:
        self.group_dir = group_dir
        self.shown = shown or str(group_dir)
        self.backend = backend
        self.api = api
        self.path = os.environ.get("PATH", "") if path is None else path

    @property
    def location(self) -> str:
        if self.backend:
            conf = self.backend.get("configuration", {})
            return f"gs://{conf.get('bucket')}/{str(conf.get('prefix', '')).strip('/')}/default.tfstate"
        return str(self.group_dir / "terraform.tfstate")

    def init(self) -> None:
        """``terraform init``: a GCS backend needs an existing bucket."""
        if self.backend:
            if self.backend.get("type") != "gcs":
                raise Fatal(
                    f"Error: exit status 1\n\nError: Unsupported backend type {go_quote(str(self.backend.get('type')))}"
                )
            bucket = self.backend.get("configuration", {}).get("bucket")
            if not bucket:
                raise hint_error(
                    'exit status 1\n\nError: "bucket": required field is not set',
                    f"initialization of deployment group {self.shown} failed; manually resolve errors",
                )
            if self.api.get_bucket(str(bucket)) is None:
                raise hint_error(
                    "exit status 1\n\nError: Failed to get existing workspaces: querying Cloud Storage failed: "
                    "storage: bucket doesn't exist",
                    f"initialization of deployment group {self.shown} failed; manually resolve errors",
                )
        if (
            not (self.group_dir / ".terraform" / "modules").is_dir()
            and shutil.which("git", path=self.path) is None
        ):
            # The blueprint's modules use registry modules (terraform-google-modules/...), which the
            # registry serves as git::https sources: the first init needs git (go-getter).
            raise hint_error(
                'exit status 1\n\nError: Failed to download module\n\nCould not download module "vpc" '
                "(modules/embedded/modules/network/vpc/main.tf:201) source code from "
                '"git::https://github.com/terraform-google-modules/terraform-google-network.git?ref=v12.0.0": '
                "error downloading 'https://github.com/terraform-google-modules/terraform-google-network.git"
                "?ref=v12.0.0': git must be available and on the PATH",
                f"initialization of deployment group {self.shown} failed; manually resolve errors",
            )
        (self.group_dir / ".terraform" / "modules").mkdir(parents=True, exist_ok=True)
        (self.group_dir / ".terraform.lock.hcl").write_text(
            '# This file is maintained automatically by "terraform init".\n'
        )

    def load(self) -> dict[str, Any]:
        raw: bytes | None = None
        if self.backend:
            conf = self.backend.get("configuration", {})
            name = f"{str(conf.get('prefix', '')).strip('/')}/default.tfstate"
            try:
                raw = self.api.download(str(conf.get("bucket")), name)
            except GcsError:
                raw = None
        else:
            path = self.group_dir / "terraform.tfstate"
            raw = path.read_bytes() if path.is_file() else None
        if not raw:
            return {
                "version": 4,
                "terraform_version": TERRAFORM_VERSION,
                "serial": 0,
                "lineage": str(uuid.uuid4()),
                "outputs": {},
                "resources": [],
            }
        return dict(json.loads(raw))

    def save(self, state: dict[str, Any]) -> None:
        state["serial"] = int(state.get("serial", 0)) + 1
        data = json.dumps(state, indent=2).encode()
        if self.backend:
            conf = self.backend.get("configuration", {})
            name = f"{str(conf.get('prefix', '')).strip('/')}/default.tfstate"
            self.api.upload(str(conf.get("bucket")), name, data)
        else:
            (self.group_dir / "terraform.tfstate").write_bytes(data)


def _resource_list(group: dict[str, Any]) -> list[tuple[str, str]]:
    """``(address, kind)`` of the Terraform resources a group's modules create."""
    resources: list[tuple[str, str]] = []
    for module in group["modules"]:
        prefix = f"module.{module['id']}"
        source = str(module.get("source", ""))
        settings = module.get("settings") or {}
        if source.endswith("network/vpc"):
            resources += [
                (f"{prefix}.module.vpc.module.vpc.google_compute_network.network", "network"),
                (f'{prefix}.module.vpc.module.subnets.google_compute_subnetwork.subnetwork["sub"]', "subnet"),
                (f'{prefix}.module.firewall_rules.google_compute_firewall.rules["internal"]', "firewall"),
            ]
        elif source.endswith("project/service-account"):
            resources.append((f"{prefix}.google_service_account.service_account[0]", "service_account"))
            for role in settings.get("project_roles") or []:
                resources.append((f'{prefix}.google_project_iam_member.project_roles["{role}"]', "iam"))
        elif source.endswith("scheduler/gke-cluster"):
            resources.append((f"{prefix}.google_container_cluster.gke_cluster", "cluster"))
            if settings.get("enable_pathways_for_tpus"):
                resources.append((f"{prefix}.google_container_node_pool.cpu_node_pool[0]", "cpu_pool"))
        elif source.endswith("compute/gke-node-pool"):
            resources.append((f"{prefix}.google_container_node_pool.node_pool[0]", "node_pool"))
        elif source.endswith("management/kubectl-apply"):
            resources += [
                (f"{prefix}.module.install_kueue[0].kubectl_manifest.manifest", "manifest"),
                (f"{prefix}.module.install_jobset[0].kubectl_manifest.manifest", "manifest"),
            ]
        else:
            resources.append((f"{prefix}.terraform_data.module", "other"))
    return resources


def _chips_per_vm(machine_type: str) -> int:
    match = re.search(r"-(\d+)t$", machine_type)
    return int(match.group(1)) if match else 1


def _chips_in_topology(topology: str) -> int:
    total = 1
    for piece in str(topology).split("x"):
        if piece.isdigit():
            total *= int(piece)
    return total


def desired_cluster(
    bp: dict[str, Any], group: dict[str, Any], group_dir: Path | None = None
) -> dict[str, Any]:
    """The cluster record the group's configuration describes (``group_dir``: where Terraform
    reads the group's files from, for the Kueue configuration file)."""
    variables = bp["vars"]
    project, region, zone = variables.get("project_id"), variables.get("region"), variables.get("zone")
    deployment = str(variables["deployment_name"])
    accounts = inventory.cluster_service_accounts(str(project), deployment)
    node_pool_roles: list[str] = []
    workload_roles: list[str] = []
    cluster_settings: dict[str, Any] = {}
    kueue_settings: dict[str, Any] | None = None
    pools: list[dict[str, Any]] = []
    for module in group["modules"]:
        source = str(module.get("source", ""))
        settings = module.get("settings") or {}
        if source.endswith("project/service-account"):
            roles = [str(r) for r in settings.get("project_roles") or []]
            if str(settings.get("name", "")).endswith("np-sa") or module["id"] == "node_pool_service_account":
                node_pool_roles = roles
            else:
                workload_roles = roles
        elif source.endswith("scheduler/gke-cluster"):
            cluster_settings = settings
        elif source.endswith("management/kubectl-apply"):
            kueue_settings = dict(settings.get("kueue") or {})
        elif source.endswith("compute/gke-node-pool"):
            machine = str(settings.get("machine_type") or variables.get("machine_type") or "")
            topology = (
                settings.get("placement_policy", {}).get("tpu_topology")
                if isinstance(settings.get("placement_policy"), dict)
                else None
            )
            slices = settings.get("num_slices") or 1
            nodes = max(1, _chips_in_topology(str(topology)) // _chips_per_vm(machine)) if topology else 1
            affinity = settings.get("reservation_affinity") or {}
            reservations = affinity.get("specific_reservations") or []
            pools.append(
                {
                    "name": str(settings.get("name") or module["id"]),
                    "machine_type": machine,
                    "topology": topology,
                    "num_slices": int(slices) if str(slices).isdigit() else slices,
                    "nodes": nodes * (int(slices) if str(slices).isdigit() else 1),
                    "zones": settings.get("zones"),
                    "reservation": reservations[0].get("name") if reservations else None,
                    "reservation_affinity": {
                        "type": affinity.get("consume_reservation_type"),
                        "names": [r.get("name") if isinstance(r, dict) else None for r in reservations],
                    },
                    "service_account": accounts["node_pool"],
                    "group": str(group.get("group")),
                    # gke-node-pool variables.tf enable_gcfs (default false) -> main.tf's
                    # gcfs_config { enabled } (v1.95.0 l.74-78, l.237-242): image streaming
                    "enable_gcfs": bool(settings.get("enable_gcfs")),
                    # variables.tf image_type, default COS_CONTAINERD (l.119-122 at v1.95.0)
                    "image_type": str(settings.get("image_type") or "COS_CONTAINERD"),
                    **consumption_of(settings, machine),
                }
            )
    system_pool = {
        "name": "system",
        "machine_type": str(cluster_settings.get("system_node_pool_machine_type", "e2-standard-4")),
        "nodes": 1,
        "zones": cluster_settings.get("system_node_pool_zones"),
        "service_account": accounts["node_pool"],
    }
    all_pools = [system_pool]
    if cluster_settings.get("enable_pathways_for_tpus"):
        all_pools.append(
            {
                "name": "cpu-np",
                # modules/scheduler/gke-cluster/main.tf google_container_node_pool "cpu_np"
                "machine_type": "n4-standard-64",
                "nodes": 1,
                "service_account": accounts["node_pool"],
            }
        )
    all_pools += pools
    tpu_pool = pools[0] if pools else {}
    record = {
        "name": deployment,
        "project": project,
        "region": region,
        "zone": zone,
        "deployment_name": deployment,
        "blueprint_name": bp["blueprint_name"],
        "labels": dict(variables.get("labels") or {}),
        "vars": {k: v for k, v in variables.items() if k != "labels"},
        "machine_type": tpu_pool.get("machine_type"),
        "tpu_topology": tpu_pool.get("topology"),
        "num_slices": tpu_pool.get("num_slices", 0),
        "reservation": tpu_pool.get("reservation"),
        "node_pools": all_pools,
        "node_pool_roles": node_pool_roles,
        "workload_roles": workload_roles,
        "service_accounts": accounts,
        "pathways": bool(cluster_settings.get("enable_pathways_for_tpus")),
        # gke-cluster variables.tf k8s_service_account_name (default), made by
        # configure_workload_identity_sa and bound to the workload service account
        "workload_identity_ksa": (
            str(cluster_settings.get("k8s_service_account_name") or "workload-identity-k8s-sa")
            if cluster_settings.get("configure_workload_identity_sa")
            else None
        ),
        "kueue": cluster_queue(
            kueue_settings,
            bool(cluster_settings.get("enable_pathways_for_tpus")),
            group_dir,
            kubectl_apply_copy(group_dir) if group_dir is not None else None,
        ),
    }
    record["settings_digest"] = hashlib.sha256(
        json.dumps(record, sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    return record


# modules/management/kubectl-apply/main.tf kueue_config_template_vars: the defaults the module merges
# under the blueprint's config_template_vars.
KUEUE_TEMPLATE_DEFAULTS = {"pathways_cpu_quota": 480, "pathways_memory_quota": "2000G", "tpu_quota": "999999"}
# kueue/kueue-configuration-pathways.yaml.tftpl: the queue the module applies on a Pathways cluster
# when the blueprint names no config_path (TPU quota, and cpu/memory on a flavor pinned to cpu-np).
PATHWAYS_QUEUE_RESOURCES = ("google.com/tpu", "cpu", "memory")
_TEMPLATE_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def cluster_queue(
    kueue: dict[str, Any] | None, pathways: bool, group_dir: Path | None, module: Path | None = None
) -> dict[str, Any]:
    """:func:`_cluster_queue`, with ``installed``: Kueue is installed, so a job is admitted only
    through the queue."""
    queue = _cluster_queue(kueue, pathways, group_dir, module)
    if kueue and kueue.get("install"):
        queue["installed"] = True
    return queue


def _cluster_queue(
    kueue: dict[str, Any] | None, pathways: bool, group_dir: Path | None, module: Path | None = None
) -> dict[str, Any]:
    """The Kueue ClusterQueue the kubectl-apply module configures: the resources it covers and
    its nominal quotas (``{"covered": [...], "quota": {...}}``; ``error`` for a failed precondition).

    kubectl-apply main.tf: a blueprint ``config_path`` is rendered with the template vars and
    applied instead of the default; without one, a Pathways cluster gets
    ``kueue-configuration-pathways.yaml.tftpl`` (its precondition wants ``accelerator_type``).
    ``module``: the module copy Terraform reads; one without that file (before v1.92.0) has no
    default: only its ``pathways.yaml.tftpl`` queue (cpu/memory, no TPU) when Pathways is on
    (main.tf l.22-35 at v1.91.0), else no ClusterQueue.
    """
    import yaml

    if not kueue or not kueue.get("install"):
        return {"covered": [], "quota": {}}
    template_vars = {**KUEUE_TEMPLATE_DEFAULTS, **dict(kueue.get("config_template_vars") or {})}
    config_path = str(kueue.get("config_path") or "")
    staged = GHPC_STAGE_RE.fullmatch(config_path.strip())
    if staged:  # evaluated at create: the copy next to the groups
        config_path = staged_destination(_unescape(staged.group(1)))
    if not config_path:
        if module is not None and not (module / "kueue" / KUEUE_DEFAULT_TEMPLATE).is_file():
            module_var = (module / "variables.tf").is_file() and pathways
            if (module / "kueue" / KUEUE_OLD_PATHWAYS_TEMPLATE).is_file() and (
                kueue.get("enable_pathways_for_tpus") or module_var
            ):
                return {"covered": ["cpu", "memory"], "quota": {"cpu": 480, "memory": "2000G"}}
            return {"covered": [], "quota": {}}
        if not pathways:
            return {"covered": [], "quota": {}}
        if "accelerator_type" not in (kueue.get("config_template_vars") or {}):
            return {
                "covered": [],
                "quota": {},
                "error": "Error: Resource precondition failed\n\n  on modules/embedded/modules/management/"
                "kubectl-apply/main.tf\n\naccelerator_type must be set in kueue.config_template_vars when "
                "using the default pathways configuration.",
            }
        return {
            "covered": list(PATHWAYS_QUEUE_RESOURCES),
            "quota": {
                "google.com/tpu": template_vars["tpu_quota"],
                "cpu": template_vars["pathways_cpu_quota"],
                "memory": template_vars["pathways_memory_quota"],
            },
        }
    path = Path(config_path) if os.path.isabs(config_path) or group_dir is None else group_dir / config_path
    try:
        text = path.read_text()
    except OSError:
        return {
            "covered": [],
            "quota": {},
            "error": f"Error: Invalid function argument\n\nno file exists at {config_path}",
        }
    # Terraform's templatefile refuses a template that refers to a key its vars map lacks
    # (internal/lang/funcs/filesystem.go MakeTemplateFileFunc, read in fugue/regula's copy of it:
    # "vars map does not contain key %q, referenced at %s", the name's source range, 1-based columns,
    # end exclusive) and ignores keys the template does not use.
    for line_number, line in enumerate(text.splitlines(), start=1):
        for match in _TEMPLATE_REF.finditer(line):
            if match.group(1) not in template_vars:
                return {
                    "covered": [],
                    "quota": {},
                    "error": "Error: Invalid function argument\n\n  on modules/embedded/modules/management/"
                    'kubectl-apply/main.tf\n\nInvalid value for "vars" parameter: vars map does not contain '
                    f'key "{match.group(1)}", referenced at {config_path}:{line_number},'
                    f"{match.start() + 3}-{match.end()}.",
                }
    rendered = _TEMPLATE_REF.sub(lambda m: str(template_vars[m.group(1)]), text)
    covered: list[str] = []
    quota: dict[str, Any] = {}
    for doc in yaml.safe_load_all(rendered):
        if not isinstance(doc, dict) or doc.get("kind") != "ClusterQueue":
            continue
        for group in (doc.get("spec") or {}).get("resourceGroups") or []:
            covered += [str(r) for r in group.get("coveredResources") or []]
            for flavor in group.get("flavors") or []:
                for resource in flavor.get("resources") or []:
                    quota[str(resource.get("name"))] = resource.get("nominalQuota")
    return {"covered": covered, "quota": quota}


def plan_errors(bp: dict[str, Any], record: dict[str, Any], group_dir: Path) -> list[str]:
    """Errors ``terraform plan`` would report for this configuration."""
    variables = bp["vars"]
    errors = []
    for key in ("project_id", "region", "zone"):
        if variables.get(key) in (None, ""):
            errors.append(
                f'Error: No value for required variable\n\n  on variables.tf line 1:\n   1: variable "{key}" {{\n\n'
                f'The root module input variable "{key}" is not set, and has no default value. Use a -var or '
                "-var-file command line argument to provide a value for this variable."
            )
    if errors:
        return errors
    for address, account in (
        ("node_pool_service_account", record["service_accounts"]["node_pool"]),
        ("workload_service_account", record["service_accounts"]["workload"]),
    ):
        account_id = account.split("@", 1)[0]
        if not SA_ACCOUNT_ID_RE.match(account_id):
            errors.append(
                f'Error: "account_id" ("{account_id}") doesn\'t match regexp "^[a-z](?:[-a-z0-9]{{4,28}}[a-z0-9])$"\n\n'
                f"  with module.{address}.google_service_account.service_account[0],\n"
                f'  on modules/embedded/modules/project/service-account/main.tf line 42, in resource "google_service_account" "service_account":'
            )
    for pool in record["node_pools"]:
        errors += _reservation_errors(pool)
        errors += _consumption_errors(pool)
    queue = record.get("kueue") or {}
    if queue.get("error"):
        errors.append(queue["error"])
    if len(str(record["name"])) > 40:
        errors.append(f"Error: expected length of name to be in the range (1 - 40), got {record['name']}")
    del group_dir
    return errors


_NODE_POOL_TF = "modules/embedded/modules/compute/gke-node-pool/main.tf"


def _reservation_errors(pool: dict[str, Any]) -> list[str]:
    """gke-node-pool's two reservation preconditions (``modules/compute/gke-node-pool/main.tf``):
    ``SPECIFIC_RESERVATION`` takes exactly one ``specific_reservations`` entry and the other types
    none; an entry must name a reservation that exists in the pool's zones, which no empty or
    missing name does (``reservation_definitions.tf`` looks it up by name)."""
    affinity = pool.get("reservation_affinity")
    if not affinity:
        return []
    kind, names = affinity.get("type"), affinity.get("names") or []
    where = f'\n\n  on {_NODE_POOL_TF}, in resource "google_container_node_pool" "node_pool":'
    if (kind == "SPECIFIC_RESERVATION") != (len(names) == 1) or (kind != "SPECIFIC_RESERVATION" and names):
        return [
            f"Error: Resource precondition failed{where}\n\nWhen using NO_RESERVATION or ANY_RESERVATION as "
            "the `consume_reservation_type`, `specific_reservations` cannot be set.\nOn the other hand, with "
            "SPECIFIC_RESERVATION you must set `specific_reservations`."
        ]
    if names and names[0] in (None, ""):
        return [
            f"Error: Resource precondition failed{where}\n\nCheck if your reservation is configured correctly:\n"
            "- A reservation with the name must exist in the specified project and all of the specified zones "
            "(var.zones must be explicitly provided when var.is_reservation_active is true)\n\n"
            '- Its consumption type must be "specific"'
        ]
    return []


def consumption_of(settings: dict[str, Any], machine_type: str) -> dict[str, Any]:
    """A node pool's consumption option (Spot, DWS flex-start, queued provisioning) and the
    settings gke-node-pool's preconditions check with it; nothing for a pool with none."""
    options = {
        key: bool(settings.get(key)) for key in ("spot", "enable_flex_start", "enable_queued_provisioning")
    }
    if not any(options.values()):
        return {}
    policy = settings.get("placement_policy")
    placement: dict[str, Any] = policy if isinstance(policy, dict) else {}
    return {
        "consumption": {
            **options,
            # gke-node-pool variables.tf defaults: auto_repair true, static_node_count null
            "auto_repair": settings.get("auto_repair", True),
            "static_node_count": settings.get("static_node_count"),
            "placement": placement.get("type"),
            "tpu": machine_type.startswith("ct"),
            "machine_type": machine_type,
        }
    }


def _consumption_errors(pool: dict[str, Any]) -> list[str]:
    """gke-node-pool's preconditions on Spot and DWS flex-start (``modules/compute/gke-node-pool/
    main.tf`` l.415-438 and l.452-460 at cluster-toolkit 1047080), each failed one reported, as
    Terraform reports every failed condition of a resource."""
    option = pool.get("consumption")
    if not option:
        return []
    # variables.tf reservation_affinity default: NO_RESERVATION
    kind = (pool.get("reservation_affinity") or {}).get("type") or "NO_RESERVATION"
    flex, spot, queued = option["enable_flex_start"], option["spot"], option["enable_queued_provisioning"]
    failed = [
        (
            flex and option["auto_repair"] is not False,
            "enable_flex_start needs node auto_repair set to false.",
        ),
        (
            flex and option["static_node_count"] is not None,
            "enable_flex_start does not work with static_node_count. static_node_count should be set to null.",
        ),
        (
            flex and kind != "NO_RESERVATION",
            "enable_flex_start requires reservation_affinity.consume_reservation_type to be 'NO_RESERVATION'.",
        ),
        (
            flex and spot,
            "Both enable_flex_start and spot consumption option cannot be set to true at the same time.",
        ),
        (
            queued and spot,
            "Both enable_queued_provisioning and spot consumption option cannot be set to true at the same time.",
        ),
        (
            spot and kind != "NO_RESERVATION",
            "Spot consumption option only works with reservation_affinity consume_reservation_type NO_RESERVATION.",
        ),
        (
            flex
            and option["placement"] == "COMPACT"
            and not option["tpu"]
            and not re.match(r"^(a3-ultragpu-|a4-|h4d-)", str(option["machine_type"])),
            "Compact placement with DWS Flex start is only supported for A3 Ultra, A4, and H4D machine types.",
        ),
    ]
    where = f'\n\n  on {_NODE_POOL_TF}, in resource "google_container_node_pool" "node_pool":'
    return [
        f"Error: Resource precondition failed{where}\n\n{message}" for broken, message in failed if broken
    ]


class DeploymentRunner:
    """Runs ``deploy``/``destroy`` for one deployment folder."""

    def __init__(
        self,
        layout: SandboxLayout,
        api: GcsApi,
        console: Console,
        faults: FaultGate,
        auto_approve: bool,
        read_line: Callable[[], str | None],
        step_seconds: float,
        on_cluster_deleted: Callable[[dict[str, Any]], None],
        path: str | None = None,
    ) -> None:
        self.path = path
        self.layout = layout
        self.store = StateStore(layout)
        self.api = api
        self.console = console
        self.faults = faults
        self.auto_approve = auto_approve
        self.read_line = read_line
        self.step_seconds = step_seconds
        self.on_cluster_deleted = on_cluster_deleted

    # -- prompt ---------------------------------------------------------------------------
    def approve(self, summary: str, full: str) -> bool:
        if self.auto_approve:
            return True
        self.console.info(f"Summary of proposed changes: {summary.strip()}")
        while True:
            self.console.out(
                "(D)isplay full proposed changes,\n(A)pply proposed changes,\n(S)top and exit,\n"
                "(C)ontinue without applying\nPlease select an option [d,a,s,c]: "
            )
            answer = self.read_line()
            if answer is None:
                raise PromptExit("EOF")
            choice = answer.strip().lower()
            if choice == "a":
                return True
            if choice == "c":
                return False
            if choice == "d":
                self.console.out(full + "\n")
            if choice == "s":
                raise PromptExit(
                    "user chose to stop execution of gcluster rather than make proposed changes to infrastructure",
                    code=0,
                )

    def _capacity_pause(self, what: str) -> None:
        """A part of a TPU node pool's create or destroy, in estimated minutes when the time scale
        is on (``timescale.CAPACITY_MINUTES``)."""
        settings = load_settings(self.layout)
        time.sleep(capacity_seconds(settings.minute_seconds, what, settings.capacity_minutes))

    def _bring_up_tpu_nodes(self, key: str, pools: list[dict[str, Any]]) -> None:
        """The TPU pools' node VMs (world/gke_nodes.py): inserted, through PENDING, PROVISIONING
        and STAGING to RUNNING (unbilled until then), then booted until their nodes are Ready."""
        settings = load_settings(self.layout)
        begin = time.time()
        running_at = begin
        with self.store.txn() as txn:
            cluster = txn.doc("clusters").get(key)
            if cluster is None:
                return
            for pool in pools:
                # a flex-start pool whose zone has no flex-start capacity stays empty: the
                # autoscaler's scale-up for a pod that asks for it fails (capacity.flex_scale_up_failure,
                # what the Kubernetes API's events of that pod say: apis/kube_api.py)
                failure = capacity.flex_scale_up_failure(
                    settings.tpu_capacity_out, gke_nodes.pool_zone(cluster, pool), pool
                )
                if failure is not None:
                    pool["scale_up_failure"] = failure
                    continue
                if gke_nodes.is_tpu_pool(pool):
                    running_at = max(
                        running_at,
                        gke_nodes.create_nodes(
                            txn,
                            cluster,
                            pool,
                            begin=begin,
                            minute_seconds=settings.minute_seconds,
                            overrides=dict(settings.capacity_minutes),
                        ),
                    )
        time.sleep(max(0.0, running_at - time.time()))
        with self.store.txn() as txn:
            cluster = txn.doc("clusters").get(key)
            for pool in pools:
                if cluster is not None and gke_nodes.is_tpu_pool(pool) and not pool.get("scale_up_failure"):
                    gke_nodes.finish_creates(txn, cluster, pool, running_at)
        self._capacity_pause("tpu_node_ready")

    def _drain_tpu_nodes(self, key: str, group: dict[str, Any]) -> None:
        """GKE drains the group's TPU pools' nodes before their VMs go: it deletes their pods with a
        grace period of the largest ``terminationGracePeriodSeconds`` among those still running
        (30 s where unset, capped at an hour), on the time scale; no pod running, no drain
        (``timescale.drain_seconds``, ``gke_nodes.running_pod_graces``). The VMs run meanwhile."""
        settings = load_settings(self.layout)
        cluster = self.store.read("clusters").get(key) or {}
        jobs = list(self.store.read("jobs").values())
        graces = [
            grace
            for pool in cluster.get("node_pools", [])
            if pool.get("group") == group["group"] and gke_nodes.is_tpu_pool(pool)
            for grace in gke_nodes.running_pod_graces(jobs, key, pool)
        ]
        time.sleep(drain_seconds(settings.minute_seconds, graces))

    def _take_down_tpu_nodes(self, key: str, group: dict[str, Any]) -> None:
        """The group's TPU pools' node VMs deleted by their managed instance group: STOPPING (billing
        ends), then gone."""
        settings = load_settings(self.layout)
        begin = time.time()
        with self.store.txn() as txn:
            cluster = txn.doc("clusters").get(key)
            pools = [p for p in (cluster or {}).get("node_pools", []) if p.get("group") == group["group"]]
            keys = [k for pool in pools for k in gke_nodes.begin_deletes(txn, cluster or {}, pool, begin)]
        stopping = capacity_seconds(settings.minute_seconds, "vm_stopping", settings.capacity_minutes)
        time.sleep(stopping)
        with self.store.txn() as txn:
            gke_nodes.finish_deletes(txn, keys, begin + stopping)

    def _pause(self, factor: float = 1.0) -> None:
        time.sleep(max(0.0, self.step_seconds * factor))

    # -- deploy ---------------------------------------------------------------------------
    def deploy(self, depl: Path, display: str, only: list[str] | None, skip: list[str] | None) -> None:
        artifacts = _artifacts(depl)
        if not (artifacts.is_dir() and os.access(artifacts, os.W_OK)):
            raise Fatal(f"Error: {os.path.join(display, '.ghpc', 'artifacts')} must be a writable directory")
        bp = load_blueprint(artifacts / "expanded_blueprint.yaml")
        self._check_groups(bp, depl, only, skip)
        for group in bp["deployment_groups"]:
            name = str(group["group"])
            if not self._selected(name, only, skip):
                self.console.info(f"skipping group {go_quote(name)}")
                continue
            shown = os.path.join(display, name)
            # cmd/deploy.go deployTerraformGroup: shell.ImportInputs first
            upstream = missing_upstream_outputs(depl, bp, group)
            if upstream is not None:
                raise hint_error(
                    f'The configuration file "{_artifacts(depl) / f"{upstream}_outputs.tfvars"}" could not be read.',
                    f'consider running "gcluster export-outputs {os.path.join(display, upstream)}"',
                )
            if is_pool_group(group):
                self._deploy_pool_group(bp, group, depl / name, shown)
            else:
                self._deploy_group(bp, group, depl / name, shown)
        self.console.info("\n###############################")
        self.console.info("Find instructions for cleanly destroying infrastructure and advanced manual")
        self.console.info("deployment instructions at:")
        self.console.info("")
        self.console.info(os.path.join(display, "instructions.txt"))

    @staticmethod
    def _selected(name: str, only: list[str] | None, skip: list[str] | None) -> bool:
        if only:
            return name in only
        if skip:
            return name not in skip
        return True

    def _check_groups(
        self, bp: dict[str, Any], depl: Path, only: list[str] | None, skip: list[str] | None
    ) -> None:
        if only and skip:
            raise Fatal("Error: cannot specify both --only and --skip")
        names = group_names(bp)
        for wanted in (only or []) + (skip or []):
            if wanted not in names:
                raise Fatal(f"Error: group {go_quote(wanted)} not found")
        for name in names:
            if not (depl / name).is_dir():
                raise Fatal(f"Error: improper deployment: {depl / name} is not a directory for group {name}")

    def _terraform_state(self, group: dict[str, Any], group_dir: Path, shown: str) -> TerraformState:
        return TerraformState(group_dir, group.get("terraform_backend"), self.api, shown, self.path)

    def _deploy_group(self, bp: dict[str, Any], group: dict[str, Any], group_dir: Path, shown: str) -> None:
        tf = self._terraform_state(group, group_dir, shown)
        if not (group_dir / ".terraform").is_dir():
            self.console.info(f"Initializing deployment group {shown}")
        tf.init()
        self.console.info(
            f"Testing if deployment group {shown} requires adding or changing cloud infrastructure"
        )
        desired = desired_cluster(bp, group, group_dir)
        problems = plan_errors(bp, desired, group_dir)
        if problems:
            raise hint_error(
                "exit status 1\n\n" + "\n\n".join(problems),
                f"terraform plan for deployment group {shown} failed",
            )
        state = tf.load()
        key = inventory.cluster_key(str(desired["project"]), str(desired["region"]), str(desired["name"]))
        world = self.store.read("clusters").get(key)
        world_exists = bool(world and world.get("exists", True))
        resources = _resource_list(group)
        managed = {r["address"] for r in state.get("resources", [])}
        state_cluster = next((r for r in state.get("resources", []) if r.get("kind") == "cluster"), None)
        if state_cluster and not world_exists:
            managed = set()  # refresh: the objects are gone, Terraform drops them from state
        to_add = [r for r in resources if r[0] not in managed]
        in_sync = (
            world_exists
            and world is not None
            and world.get("healthy", True)
            and world.get("settings_digest") == desired["settings_digest"]
        )
        to_change = [] if (in_sync or to_add) else [r for r in resources if r[1] in ("cluster", "node_pool")]
        if not to_add and not to_change:
            self.console.info(f"Cloud infrastructure in deployment group {shown} is already applied")
            self._write_outputs(group_dir, shown, desired)
            return
        summary = f"Plan: {len(to_add)} to add, {len(to_change)} to change, 0 to destroy."
        self.console.info(f"Deployment group {shown} requires adding or changing cloud infrastructure")
        full = (
            "\n".join(
                f"  # {address} will be {'created' if (address, kind) in to_add else 'updated in-place'}"
                for address, kind in to_add + to_change
            )
            + "\n\n"
            + summary
        )
        if not self.approve(summary, full):
            return
        self.console.info(f"Running terraform apply on deployment group {shown}")
        self._apply(tf, state, desired, key, world_exists and not state_cluster, to_add, to_change)
        self._write_outputs(group_dir, shown, desired)

    def _apply(
        self,
        tf: TerraformState,
        state: dict[str, Any],
        desired: dict[str, Any],
        key: str,
        conflict: bool,
        to_add: list[tuple[str, str]],
        to_change: list[tuple[str, str]],
    ) -> None:
        project, region, name = desired["project"], desired["region"], desired["name"]
        cluster_id = f"projects/{project}/locations/{region}/clusters/{name}"
        lines: list[str] = []
        for address, _kind in to_change:
            lines.append(f"{address}: Modifying... [id={cluster_id}]")
        for address, kind in to_add:
            if kind in ("cluster", "node_pool", "cpu_pool"):
                break
            lines.append(f"{address}: Creating...")
        self.console.terraform("\n".join(lines))
        self._pause()
        if conflict:
            self._fail_apply(
                f'Error: googleapi: Error 409: Already exists: {cluster_id}.\nDetails:\n[\n  {{\n    "@type": '
                '"type.googleapis.com/google.rpc.RequestInfo"\n  }\n]\n, alreadyExists\n\n'
                f"  with module.gke-tpu-v6e-cluster.google_container_cluster.gke_cluster,\n"
                "  on modules/embedded/modules/scheduler/gke-cluster/main.tf line 102, in resource "
                '"google_container_cluster" "gke_cluster":\n 102: resource "google_container_cluster" "gke_cluster" {'
            )
        # the stockout fault hits the TPU node pool's creation: only a group that has one
        fault = self.faults.fire("deploy") if any(k == "node_pool" for _, k in to_add + to_change) else None
        created_cluster = any(kind == "cluster" for _, kind in to_add)
        if created_cluster:
            self.console.terraform(
                f"module.gke-tpu-v6e-cluster.google_container_cluster.gke_cluster: Creating...\n"
                f"module.gke-tpu-v6e-cluster.google_container_cluster.gke_cluster: Still creating... [10s elapsed]\n"
                f"module.gke-tpu-v6e-cluster.google_container_cluster.gke_cluster: Creation complete after 7m31s [id={cluster_id}]"
            )
        self._pause()
        if fault is not None:
            # The cluster exists, the TPU node pool does not: record the half-done world and state.
            self._record_world(key, desired, healthy=False)
            state["resources"] = [
                {
                    "address": a,
                    "kind": k,
                    "status": "tainted" if k == "node_pool" else "ready",
                    "id": cluster_id,
                }
                for a, k in _resource_list_from(desired, to_add, state)
                if k != "node_pool"
            ]
            tf.save(state)
            pool = "module.gke-tpu-v6e-pool.google_container_node_pool.node_pool[0]"
            if fault.transient:
                detail = (
                    f"Error: error creating NodePool: googleapi: Error 400: Instance 'gke-{name}-tpu-pool-9f2c' creation "
                    f"failed: Code: 'GCE_STOCKOUT'. Message: 'The zone 'projects/{project}/zones/{desired['zone']}' does "
                    "not have enough resources available to fulfill the request.  Try a different zone, or try again "
                    "later. (ZONE_RESOURCE_POOL_EXHAUSTED)'., stockout"
                )
            else:
                detail = (
                    f"Error: error creating NodePool: googleapi: Error 400: Reservation "
                    f"'projects/{project}/zones/{desired['zone']}/reservations/{desired.get('reservation') or ''}' "
                    "does not exist or is not usable: invalid value for field 'nodePool.config.reservationAffinity'., "
                    "badRequest"
                )
            self._fail_apply(
                f"{detail}\n\n  with {pool},\n  on modules/embedded/modules/compute/gke-node-pool/main.tf line 59, in "
                'resource "google_container_node_pool" "node_pool":\n  59: resource "google_container_node_pool" "node_pool" {'
            )
        for address, kind in to_add:
            if kind in ("node_pool", "cpu_pool"):
                self.console.terraform(
                    f"{address}: Creating...\n{address}: Creation complete after 4m2s [id={cluster_id}/nodePools/x]"
                )
        self._record_world(key, desired, healthy=True)
        state["resources"] = [
            {
                "address": address,
                "kind": kind,
                "status": "ready",
                "id": cluster_id,
                "attributes": {
                    "name": name,
                    "location": region,
                    "project": project,
                    "resource_labels": desired["labels"],
                }
                if kind == "cluster"
                else {},
            }
            for address, kind in _resource_list_from(desired, to_add, state)
        ]
        state["outputs"] = {
            "instructions_gke-tpu-v6e-cluster": {
                "value": f"gcloud container clusters get-credentials {name} --region {region} --project {project}",
                "type": "string",
            }
        }
        tf.save(state)
        self.console.terraform(
            f"\nApply complete! Resources: {len(to_add)} added, {len(to_change)} changed, 0 destroyed.\n"
        )

    def _fail_apply(self, detail: str) -> None:
        box = ["╷"] + [f"│ {line}" if line else "│" for line in detail.splitlines()] + ["╵"]
        self.console.terraform("\n".join(box), stream="err")
        raise Fatal("Error: exit status 1\n\n" + detail)

    def _record_world(self, key: str, desired: dict[str, Any], healthy: bool) -> None:
        with self.store.txn() as txn:
            clusters = txn.doc("clusters")
            previous = clusters.get(key)
            record = dict(desired)
            record["created"] = (
                previous["created"] if previous and previous.get("exists", True) else rfc3339()
            )
            record["exists"] = True
            record["healthy"] = healthy
            if previous and previous.get("exists", True):
                # the node pools of the other deployment groups stay as they are
                mine = {p.get("group") for p in record["node_pools"] if p.get("group")}
                record["node_pools"] = record["node_pools"] + [
                    p for p in previous.get("node_pools", []) if p.get("group") and p.get("group") not in mine
                ]
            if not healthy:
                # The TPU node pool failed to come up: it is listed in ERROR and has no capacity.
                record["settings_digest"] = "unhealthy"
                record["node_pools"] = [
                    dict(p, failed=True) if p.get("topology") else p for p in record["node_pools"]
                ]
            clusters[key] = record
            txn.save("clusters")
            live_before = previous.get("node_pools", []) if previous and previous.get("exists", True) else []
            _pool_events(txn, key, live_before, record["node_pools"], time.time())
            iam = txn.doc("iam")
            accounts = iam.setdefault("service_accounts", {})
            bindings = iam.setdefault("project_bindings", {}).setdefault(str(desired["project"]), {})
            for role_key, account in (
                ("node_pool_roles", desired["service_accounts"]["node_pool"]),
                ("workload_roles", desired["service_accounts"]["workload"]),
            ):
                accounts[account] = {"project": desired["project"], "cluster": key}
                for role in desired.get(role_key, []):
                    members = bindings.setdefault(
                        f"roles/{role}" if not str(role).startswith("roles/") else str(role), []
                    )
                    member = f"serviceAccount:{account}"
                    if member not in members:
                        members.append(member)
            txn.save("iam")

    # -- a group of node pools alone (the TPU pool moved out of the cluster's group) ------------
    def _pool_group_world(
        self, bp: dict[str, Any], group: dict[str, Any]
    ) -> tuple[str, list[dict[str, Any]]]:
        desired = desired_cluster(bp, group)
        key = inventory.cluster_key(str(desired["project"]), str(desired["region"]), str(desired["name"]))
        pools = [p for p in desired["node_pools"] if p.get("group") == group["group"]]
        return key, pools

    def _deploy_pool_group(
        self, bp: dict[str, Any], group: dict[str, Any], group_dir: Path, shown: str
    ) -> None:
        """``terraform apply`` of a group holding node pools of a cluster made by an earlier group:
        the pools are added to (and, on destroy, removed from) that cluster alone."""
        tf = self._terraform_state(group, group_dir, shown)
        if not (group_dir / ".terraform").is_dir():
            self.console.info(f"Initializing deployment group {shown}")
        tf.init()
        self.console.info(
            f"Testing if deployment group {shown} requires adding or changing cloud infrastructure"
        )
        key, pools = self._pool_group_world(bp, group)
        problems = [error for pool in pools for error in _reservation_errors(pool)]
        if problems:
            raise hint_error(
                "exit status 1\n\n" + "\n\n".join(problems),
                f"terraform plan for deployment group {shown} failed",
            )
        world = self.store.read("clusters").get(key)
        if not (world and world.get("exists", True)):
            raise hint_error(
                f"exit status 1\n\nError: googleapi: Error 404: Not found: projects/{bp['vars'].get('project_id')}"
                f"/locations/{bp['vars'].get('region')}/clusters/{bp['vars'].get('deployment_name')}., notFound",
                f"terraform plan for deployment group {shown} failed",
            )
        state = tf.load()
        present = {p["name"] for p in world.get("node_pools", []) if not p.get("failed")}
        resources = _resource_list(group)
        managed = {r["address"] for r in state.get("resources", [])}
        to_add = [r for r in resources if r[0] not in managed] or (
            resources if any(p["name"] not in present for p in pools) else []
        )
        if not to_add:
            self.console.info(f"Cloud infrastructure in deployment group {shown} is already applied")
            self._write_pool_outputs(group_dir, shown, group)
            return
        summary = f"Plan: {len(to_add)} to add, 0 to change, 0 to destroy."
        self.console.info(f"Deployment group {shown} requires adding or changing cloud infrastructure")
        full = "\n".join(f"  # {address} will be created" for address, _ in to_add) + "\n\n" + summary
        if not self.approve(summary, full):
            return
        self.console.info(f"Running terraform apply on deployment group {shown}")
        self.console.terraform("\n".join(f"{address}: Creating..." for address, _ in to_add))
        self._pause()
        self._capacity_pause("tpu_pool_create")
        # the TPU capacity of the pool's kind the zone cannot give now (setting tpu_capacity_out),
        # or a reservation too small for the pool's nodes (settings reservations)
        settings = load_settings(self.layout)
        refusal = capacity.pool_refusal(settings.tpu_capacity_out, str(world.get("zone")), pools)
        stockout = refusal == capacity.STOCKOUT
        if refusal == capacity.QUOTA:
            # GKE's error when the pool's instance group cannot create its VMs for a Compute Engine
            # quota, in the shape public error reports quote it for a node pool's IGM ("Insufficient
            # quota to satisfy the request: Not all instances running in IGM after 38.19512474s.
            # Expected 3, running 1, transitioning 2. Current errors: [GCE_QUOTA_EXCEEDED]: Instance
            # 'gke-…' creation failed: Quota 'SSD_TOTAL_GB' exceeded. Limit: 250.0 in region
            # us-central1."; GKE's TPU troubleshooting page names "Insufficient quota to satisfy the
            # request"): indirect. The metric is the kind's (capacity.QUOTA_METRICS).
            tpu = next(p for p in pools if str(p.get("machine_type") or "").startswith("ct"))
            metric = capacity.QUOTA_METRICS[capacity.pool_kind(tpu)]
            limit = float(settings.region_quotas.get(metric, 0.0))
            nodes = int(tpu.get("nodes") or 1)
            self._fail_apply(
                "Error: error creating NodePool: Insufficient quota to satisfy the request: Not all instances "
                f"running in IGM after 41.273519s. Expected {nodes}, running 0, transitioning {nodes}. Current "
                f"errors: [GCE_QUOTA_EXCEEDED]: Instance 'gke-{world.get('name')}-tpu-pool-9f2c' creation "
                f"failed: Quota '{metric}' exceeded.  Limit: {limit} in region {world.get('region')}."
                f"\n\n  with {to_add[0][0]},\n  on modules/embedded/modules/compute/gke-node-pool/main.tf line 59, in "
                'resource "google_container_node_pool" "node_pool":\n  59: resource "google_container_node_pool" "node_pool" {'
            )
        full_reservation = capacity.pool_reservation_full(
            settings.reservations, str(world.get("zone")), pools
        )
        if full_reservation is not None:
            # Compute Engine's CONDITION_NOT_MET text for a full reservation (kubernetes/autoscaler's
            # gce client reads it as RESERVATION_CAPACITY_EXCEEDED), in the shape of the node
            # pool's instance-creation error above (indirect: no GKE output of it was read)
            self._fail_apply(
                f"Error: error creating NodePool: googleapi: Error 400: Instance 'gke-{world.get('name')}-tpu-pool-9f2c' "
                f"creation failed: Code: 'CONDITION_NOT_MET'. Message: 'Specified reservation '{full_reservation}' does not "
                "have available resources for the request.'., badRequest"
                f"\n\n  with {to_add[0][0]},\n  on modules/embedded/modules/compute/gke-node-pool/main.tf line 59, in "
                'resource "google_container_node_pool" "node_pool":\n  59: resource "google_container_node_pool" "node_pool" {'
            )
        fault = None if stockout else self.faults.fire("deploy")
        if stockout or fault is not None:
            project, zone = world.get("project"), world.get("zone")
            detail = (
                f"Error: error creating NodePool: googleapi: Error 400: Instance 'gke-{world.get('name')}-tpu-pool-9f2c' "
                f"creation failed: Code: 'GCE_STOCKOUT'. Message: 'The zone 'projects/{project}/zones/{zone}' does "
                "not have enough resources available to fulfill the request.  Try a different zone, or try again "
                "later. (ZONE_RESOURCE_POOL_EXHAUSTED)'., stockout"
                if stockout or (fault is not None and fault.transient)
                else f"Error: error creating NodePool: googleapi: Error 400: Reservation "
                f"'projects/{project}/zones/{zone}/reservations/{pools[0].get('reservation') if pools else ''}' "
                "does not exist or is not usable: invalid value for field 'nodePool.config.reservationAffinity'., "
                "badRequest"
            )
            self._fail_apply(
                f"{detail}\n\n  with {to_add[0][0]},\n  on modules/embedded/modules/compute/gke-node-pool/main.tf line 59, in "
                'resource "google_container_node_pool" "node_pool":\n  59: resource "google_container_node_pool" "node_pool" {'
            )
        self._bring_up_tpu_nodes(key, pools)
        cluster_id = (
            f"projects/{world.get('project')}/locations/{world.get('region')}/clusters/{world.get('name')}"
        )
        for address, _ in to_add:
            self.console.terraform(f"{address}: Creation complete after 4m2s [id={cluster_id}/nodePools/x]")
        self._set_pools(key, group, pools)
        state["resources"] = [
            {"address": address, "kind": kind, "status": "ready", "id": cluster_id}
            for address, kind in resources
        ]
        state["outputs"] = {
            f"instructions_{m['id']}": {
                "value": f"node pool {m['id']} of {world.get('name')}",
                "type": "string",
            }
            for m in group["modules"]
        }
        tf.save(state)
        self.console.terraform(f"\nApply complete! Resources: {len(to_add)} added, 0 changed, 0 destroyed.\n")
        self._write_pool_outputs(group_dir, shown, group)

    def _set_pools(self, key: str, group: dict[str, Any], pools: list[dict[str, Any]]) -> None:
        """The cluster's node pools of ``group`` become ``pools``; each pool's create and delete
        time goes to the ``node_pool_events`` record (what a test reads the TPU's billed span from)."""
        now = time.time()
        with self.store.txn() as txn:
            clusters = txn.doc("clusters")
            record = clusters.get(key)
            if record is None:
                return
            before = [p for p in record.get("node_pools", []) if p.get("group") == group["group"]]
            record["node_pools"] = [
                p for p in record.get("node_pools", []) if p.get("group") != group["group"]
            ] + pools
            tpu = next((p for p in record["node_pools"] if p.get("topology")), None)
            record["machine_type"] = tpu.get("machine_type") if tpu else None
            record["tpu_topology"] = tpu.get("topology") if tpu else None
            record["num_slices"] = tpu.get("num_slices", 0) if tpu else 0
            record["reservation"] = tpu.get("reservation") if tpu else None
            clusters[key] = record
            txn.save("clusters")
            _pool_events(txn, key, before, pools, now)

    def _write_pool_outputs(self, group_dir: Path, shown: str, group: dict[str, Any]) -> None:
        artifacts = group_dir.parent / ".ghpc" / "artifacts"
        self.console.info(f"Collecting terraform outputs from {shown}")
        target = artifacts / f"{group_dir.name}_outputs.tfvars"
        target.write_text(
            "".join(f'instructions_{m["id"]} = "node pool {m["id"]}"\n' for m in group["modules"])
        )

    def _destroy_pool_group(self, bp: dict[str, Any], group: dict[str, Any], depl: Path, shown: str) -> None:
        group_dir = depl / str(group["group"])
        tf = self._terraform_state(group, group_dir, shown)
        if not (group_dir / ".terraform").is_dir():
            self.console.info(f"Initializing deployment group {shown}")
        tf.init()
        self.console.info(f"Testing if deployment group {shown} requires destroying cloud infrastructure")
        state = tf.load()
        key, _ = self._pool_group_world(bp, group)
        world = self.store.read("clusters").get(key)
        managed = list(state.get("resources", []))
        if not managed:
            self.console.info(f"Cloud infrastructure in deployment group {shown} is already destroyed")
            return
        upstream = missing_upstream_outputs(depl, bp, group)
        if upstream is not None:
            # cmd/destroy.go: the import error is logged and the destroy goes on; Terraform then
            # has no value for the inputs the earlier group's outputs give
            self.console.error(
                f"failed to import inputs for group {go_quote(str(group['group']))}: The configuration file "
                f'"{_artifacts(depl) / f"{upstream}_outputs.tfvars"}" could not be read.'
            )
            raise Fatal(
                "exit status 1\n\nError: No value for required variable\n\n  on variables.tf line 1:\n"
                '   1: variable "cluster_id" {\n\nThe root module input variable "cluster_id" is not set, and has '
                "no default value. Use a -var or -var-file command line argument to provide a value for this variable."
            )
        if not self._confirm_destroy(shown, managed):
            return
        if world and world.get("exists", True):
            self._drain_tpu_nodes(key, group)  # their VMs still run (billed)
            self._take_down_tpu_nodes(key, group)
            self._set_pools(key, group, [])
        state["resources"] = []
        state["outputs"] = {}
        tf.save(state)
        self.console.terraform(f"\nDestroy complete! Resources: {len(managed)} destroyed.\n")

    def _confirm_destroy(self, shown: str, managed: list[dict[str, Any]]) -> bool:
        """Terraform's destroy plan of ``managed``, the approval gcluster asks for, and the start of
        the destroy; False when it is not approved (nothing is destroyed)."""
        summary = f"Plan: 0 to add, 0 to change, {len(managed)} to destroy."
        self.console.info(f"Deployment group {shown} requires destroying cloud infrastructure")
        if not self.approve(
            summary, "\n".join(f"  # {r['address']} will be destroyed" for r in managed) + "\n\n" + summary
        ):
            return False
        self.console.info(f"Running terraform apply on deployment group {shown}")
        self.console.terraform(
            "\n".join(f"{r['address']}: Destroying... [id={r.get('id', '')}]" for r in reversed(managed))
        )
        self._pause()
        return True

    def _write_outputs(self, group_dir: Path, shown: str, desired: dict[str, Any]) -> None:
        artifacts = group_dir.parent / ".ghpc" / "artifacts"
        self.console.info(f"Collecting terraform outputs from {shown}")
        target = artifacts / f"{group_dir.name}_outputs.tfvars"
        shown_target = os.path.join(os.path.dirname(shown), ".ghpc", "artifacts", target.name)
        self.console.info(
            f"Writing outputs artifact from deployment group {group_dir.name} to file {shown_target}"
        )
        target.write_text(
            f'instructions_gke-tpu-v6e-cluster = "gcloud container clusters get-credentials {desired["name"]} '
            f'--region {desired["region"]} --project {desired["project"]}"\n'
        )

    # -- destroy --------------------------------------------------------------------------
    def destroy(
        self, depl: Path, display: str, only: list[str] | None, skip: list[str] | None, robust: bool
    ) -> None:
        artifacts = _artifacts(depl)
        if not artifacts.is_dir():
            raise Fatal(
                f"Error: artifacts path {os.path.join(display, '.ghpc', 'artifacts')} is not a directory"
            )
        bp = load_blueprint(artifacts / "expanded_blueprint.yaml")
        self._check_groups(bp, depl, only, skip)
        attempts = 3 if robust else 1
        for attempt in range(1, attempts + 1):
            self.console.info(f"Destroy attempt {attempt} of {attempts}")
            failed = False
            for group in reversed(bp["deployment_groups"]):
                name = str(group["group"])
                if not self._selected(name, only, skip):
                    self.console.info(f"skipping group {go_quote(name)}")
                    continue
                if robust and any(
                    str(m.get("source", "")).startswith(("modules/network/", "community/modules/network/"))
                    for m in group["modules"]
                ):
                    project, deployment = bp["vars"].get("project_id"), bp["vars"].get("deployment_name")
                    self.console.info(
                        f"Cleaning up firewall rules for project {project}, deployment {deployment}"
                    )
                    self.console.info(f'Using wildcard network filter: name eq ".*{deployment}.*"')
                    self.console.info(f"No matching networks found for project {project}.")
                try:
                    if is_pool_group(group):
                        self._destroy_pool_group(bp, group, depl, os.path.join(display, name))
                    else:
                        self._destroy_group(bp, group, depl / name, os.path.join(display, name))
                except PromptExit:
                    raise
                except Fatal as error:
                    self.console.error(f"failed to destroy group {go_quote(name)}:\n{error.message}")
                    failed = True
                    break
            if not failed:
                self.console.info("Successfully destroyed all selected groups.")
                return
            if attempt == attempts:
                raise Fatal(f"Destruction of {go_quote(display)} failed after {attempts} attempts")
            self.console.info("Retrying destroy...")

    def _destroy_group(self, bp: dict[str, Any], group: dict[str, Any], group_dir: Path, shown: str) -> None:
        tf = self._terraform_state(group, group_dir, shown)
        if not (group_dir / ".terraform").is_dir():
            self.console.info(f"Initializing deployment group {shown}")
        tf.init()
        self.console.info(f"Testing if deployment group {shown} requires destroying cloud infrastructure")
        state = tf.load()
        desired = desired_cluster(bp, group, group_dir)
        key = inventory.cluster_key(str(desired["project"]), str(desired["region"]), str(desired["name"]))
        world = self.store.read("clusters").get(key)
        world_exists = bool(world and world.get("exists", True))
        managed = list(state.get("resources", []))
        if any(r.get("kind") == "cluster" for r in managed) and not world_exists:
            managed = [
                r for r in managed if r.get("kind") not in ("cluster", "node_pool", "cpu_pool", "manifest")
            ]
        if not managed:
            if state.get("resources"):
                state["resources"] = []
                tf.save(state)
            self.console.info(f"Cloud infrastructure in deployment group {shown} is already destroyed")
            return
        if not self._confirm_destroy(shown, managed):
            return
        # the destroy faults are the network's and the service accounts' (not a node pool's)
        fault = (
            self.faults.fire("destroy")
            if any(kind in ("network", "service_account") for _, kind in _resource_list(group))
            else None
        )
        if fault is not None:
            network = f"projects/{desired['project']}/global/networks/{desired['name']}-net-0"
            detail = (
                f"Error: Error waiting for Deleting Network: The network resource '{network}' is already being used by "
                f"'projects/{desired['project']}/global/firewalls/{desired['name']}-internal-0'"
                if fault.transient
                else f'Error: Error when reading or editing Service Account "{desired["service_accounts"]["node_pool"]}": '
                "googleapi: Error 403: Permission 'iam.serviceAccounts.delete' denied on resource (or it may not exist)., forbidden"
            )
            box = ["╷"] + [f"│ {line}" if line else "│" for line in detail.splitlines()] + ["╵"]
            self.console.terraform("\n".join(box), stream="err")
            raise Fatal("exit status 1\n\n" + detail)
        if world_exists and world is not None:
            self.on_cluster_deleted(world)
            with self.store.txn() as txn:
                _pool_events(txn, key, world.get("node_pools", []), [], time.time())
                clusters = txn.doc("clusters")
                clusters.pop(key, None)
                txn.save("clusters")
                iam = txn.doc("iam")
                for account in desired["service_accounts"].values():
                    iam.get("service_accounts", {}).pop(account, None)
                txn.save("iam")
        state["resources"] = []
        tf.save(state)
        self.console.terraform(f"\nDestroy complete! Resources: {len(managed)} destroyed.\n")


def is_pool_group(group: dict[str, Any]) -> bool:
    """A group of node pools whose cluster another (earlier) group makes."""
    sources = [str(m.get("source", "")) for m in group["modules"]]
    return any(s.endswith("compute/gke-node-pool") for s in sources) and not any(
        s.endswith("scheduler/gke-cluster") for s in sources
    )


# the node pools a deploy or destroy created and deleted: world/gke_nodes.py
_pool_events = gke_nodes.record_pool_events


def _resource_list_from(
    desired: dict[str, Any], to_add: list[tuple[str, str]], state: dict[str, Any]
) -> list[tuple[str, str]]:
    existing = [(r["address"], r.get("kind", "other")) for r in state.get("resources", [])]
    merged = dict(existing)
    for address, kind in to_add:
        merged[address] = kind
    del desired
    return list(merged.items())
