"""``tpu-rl``: print the plan of a DAG run, check the local toolchain, read the run ledger."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_tpu_rl.render.plan import (
    api_calls,
    compute_class_calls,
    gke_capacity,
    gke_image_streaming,
    gke_plan,
    plan_document,
    tpu_vm_capacity,
    tpu_vm_plan,
)
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, TPU_VM_DAG_ID, SpecError, params
from airflow_provider_tpu_rl.spec.cluster import CAPACITIES
from airflow_provider_tpu_rl.spec.pipeline import (
    ENVIRONMENT_OPTIONS,
    PLACEHOLDERS,
    gke_pipeline_from_conf,
    placeholders,
    tpu_vm_pipeline_from_conf,
)
from airflow_provider_tpu_rl.spec.presets import Runner

PLAN_DAG_IDS = (GKE_DAG_ID, TPU_VM_DAG_ID)


def build_plan(
    dag_id: str,
    conf: dict[str, Any] | None,
    run_id: str = "manual__plan",
    environment: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The JSON plan of one DAG run: every command in execution order, secrets as ``***``, and
    the run's ``capacity`` with what it renders (the TPU VM's flags, the TPU node pool's settings).

    ``environment`` (field → value, :func:`plan_environment`) is what the untouched trigger form
    holds besides its own defaults; ``conf`` overrides it. ``placeholders`` names the fields still
    holding the form's example (``validate`` refuses them): field → {"value": ..., "todo": what to
    set}.
    """
    if environment:
        conf = {**environment, **(conf or {})}
    if dag_id == GKE_DAG_ID:
        gke = gke_pipeline_from_conf(conf, dag_id=dag_id, run_id=run_id)
        resolved = gke.resolved()
        calls = api_calls(
            Runner.GKE,
            gke.cluster.project,
            gke.cluster.bucket,
            resolved["run_dirs"],
            streams_image=gke.streams_image,
            existing_cluster=gke.existing is not None,
        ) + compute_class_calls(gke)
        document = plan_document(dag_id, gke_plan(gke), calls)
        document["capacity"] = gke_capacity(gke)
        if gke.streams_image:  # the TPU pool's image streaming and what it renders
            document["image_streaming"] = gke_image_streaming(gke)
    elif dag_id == TPU_VM_DAG_ID:
        vm = tpu_vm_pipeline_from_conf(conf, dag_id=dag_id, run_id=run_id)
        resolved = vm.resolved()
        calls = api_calls(Runner.TPU_VM, vm.vm.project, vm.vm.bucket, resolved["run_dirs"])
        document = plan_document(dag_id, tpu_vm_plan(vm), calls)
        document["capacity"] = tpu_vm_capacity(vm)
    else:
        raise SpecError("dag_id", f"unknown DAG; choose one of {list(PLAN_DAG_IDS)}", dag_id)
    document["placeholders"] = {
        field: {"value": value, "todo": PLACEHOLDERS[field][1]}
        for field, value in placeholders(resolved).items()
    }
    return document


def plan_environment(dag_id: str) -> dict[str, str]:
    """The ``[tpu_rl] default_*`` options this Airflow's trigger form of ``dag_id`` is prefilled
    with (``pipelines.form.environment_defaults``, the form's own function): field → value.

    Imported here, not at the top: the rest of this module (``build_plan``) stays free of Airflow.
    """
    from airflow_provider_tpu_rl.pipelines.form import environment_defaults

    kind = "gke" if dag_id == GKE_DAG_ID else "tpu_vm"
    return environment_defaults(ENVIRONMENT_OPTIONS[kind])


def first_line(error: BaseException) -> str:
    """The first line of an error's message, cut to 200 characters (its type when empty)."""
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _load_conf(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        conf = json.loads(text)
    except json.JSONDecodeError as err:
        raise SpecError(
            "conf", f"is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
        ) from None
    except ValueError as err:  # an integer past Python's 4,300-digit conversion limit
        raise SpecError("conf", f"cannot be read: {first_line(err)}", show_value=False) from None
    except RecursionError:
        raise SpecError("conf", "is nested too deep to be read", show_value=False) from None
    if not isinstance(conf, dict):
        raise SpecError("conf", "must be a JSON object", conf)
    return conf


def _run_plan(args: argparse.Namespace) -> int:
    try:
        environment = plan_environment(args.dag_id)
    except ValueError as err:
        print(f"tpu-rl plan: {err}", file=sys.stderr)
        return 2
    try:
        document = build_plan(args.dag_id, _load_conf(args.conf), args.run_id, environment)
    except SpecError as err:
        print(f"tpu-rl plan: invalid conf: {err}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, RecursionError, OverflowError, MemoryError) as err:
        # A value no field rule names (every known one is a SpecError): still one line, exit 2.
        print(f"tpu-rl plan: invalid conf: {type(err).__name__}: {first_line(err)}", file=sys.stderr)
        return 2
    json.dump(document, sys.stdout, indent=2 if args.pretty else None)
    sys.stdout.write("\n")
    for field, found in document["placeholders"].items():
        print(
            f"tpu-rl plan: placeholder {field}={found['value']} (the form's example): "
            f"{found['todo']}; validate refuses it",
            file=sys.stderr,
        )
    return 0


DOCTOR_PURPOSES = ("deploy", "jobs", "tpu_vm", "all")


def _logs_to_stderr() -> None:
    """Send every log record to stderr (warnings, and this provider's install progress), so
    stdout holds only the doctor's table."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    for name in (None, *logging.root.manager.loggerDict):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
    logging.root.addHandler(handler)
    logging.root.setLevel(logging.WARNING)
    logging.getLogger("airflow_provider_tpu_rl").setLevel(logging.INFO)  # "Downloading terraform ..."


def _run_doctor(args: argparse.Namespace) -> int:
    """Print the toolchain table; 0 when every tool of the chosen purposes is OK, 1 otherwise."""
    # Importing Airflow may configure logging onto stdout: import with stdout redirected, then
    # send every log record to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        from airflow_provider_tpu_rl.exceptions import TpuRlError
        from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
        from airflow_provider_tpu_rl.spec import preflight as checks
        from airflow_provider_tpu_rl.toolchain.tools import ToolStatus, format_table, purposes_for

        _logs_to_stderr()
        try:
            hook = GclusterHook(args.gcluster_conn_id)
            memo: dict[str, ToolStatus] = {}
            chains = [
                hook.toolchain(purpose, install=not args.no_install, memo=memo)
                for purpose in purposes_for(args.purpose)
            ]
            # With every deploy tool found, gcluster's own check (what its deploy would ask for).
            problems: dict[str, list[str]] = {chain.purpose: [] for chain in chains}
            for chain in chains:
                if chain.purpose == "deploy" and chain.ok:
                    line = hook.gcluster_dependency_problem(chain)
                    if line:
                        problems[chain.purpose].append(line)
            credential_lines = credential_problems(hook, chains)
            for purpose, line in credential_lines.items():
                problems[purpose].append(line)
            if any(chain.purpose == "tpu_vm" and chain.ok for chain in chains):
                problems["tpu_vm"] += gcloud_component_problems(hook, args.capacity)
            if args.project and args.zone:
                for chain in chains:
                    if chain.ok and not problems[chain.purpose]:
                        runner = checks.runner(_PURPOSE_RUNNER[chain.purpose])
                        problems[chain.purpose] += quota_lines(
                            hook, args.project, args.zone, runner, args.capacity or "on-demand"
                        )
            # The project's side of the TPU VM's SSH, once the tools and the account are there.
            vm_ready = any(chain.purpose == "tpu_vm" and chain.ok for chain in chains)
            if args.project and vm_ready and not problems["tpu_vm"]:
                problems["tpu_vm"] += vm_access_problems(hook, args.project, args.ssh_source_ranges)
        except (TpuRlError, SpecError) as err:
            print(f"tpu-rl doctor: {err}", file=sys.stderr)
            return 1
    sys.stdout.write(format_table(chains, problems) + "\n")
    return 0 if all(chain.ok for chain in chains) and not any(problems.values()) else 1


def gcloud_component_problems(hook: Any, capacity: str | None) -> list[str]:
    """The gcloud components a TPU VM of ``capacity`` needs that this gcloud lacks, one line each
    (preflight's check); with no capacity given, a missing one is a note on stderr naming the
    capacity that needs it."""
    from airflow_provider_tpu_rl.render.tpu_vm import gcloud_components_needed
    from airflow_provider_tpu_rl.spec import preflight as checks

    installed = hook.gcloud_components()
    if installed is None:
        return []
    if capacity is not None:
        return [
            checks.missing_component_problem(c, capacity)
            for c in gcloud_components_needed(capacity)
            if c not in installed
        ]
    for other in CAPACITIES:
        for component in gcloud_components_needed(other):
            if component not in installed:
                print(
                    f"tpu-rl doctor: note: {checks.missing_component_problem(component, other)}",
                    file=sys.stderr,
                )
    return []


def quota_lines(hook: Any, project: str, zone: str, runner: Runner, capacity: str) -> list[str]:
    """Preflight's quota check for the default shape of ``runner`` (a v6e-32 on GKE, a v6e-8 VM):
    one line per quota with too little free in ``zone``'s region; a quota the region does not
    list is a note on stderr."""
    from airflow_provider_tpu_rl.render.preflight import describe_region
    from airflow_provider_tpu_rl.spec import preflight as checks
    from airflow_provider_tpu_rl.spec import rules
    from airflow_provider_tpu_rl.spec.pipeline import default_shape

    project = rules.project_id("project", project)
    zone = rules.zone("zone", zone, None)
    compute_type, topology = default_shape(runner)
    needs = checks.quota_needs(
        runner, capacity, checks.ReservationNeed.for_slices(compute_type, topology, 1).chips
    )
    if not needs:
        return []
    region = zone.rsplit("-", 1)[0]
    result = hook.run(describe_region(project, region), log_output=False, timeout=VM_READ_TIMEOUT)
    document = checks.parse_json_document(result.output_lines) if result.ok else None
    if document is None:
        return [
            f"could not read the quotas of region {region} in project {project}: {checks.error_line(result.output)}"
        ]
    problems, notes = checks.quota_problems(project, region, needs, document)
    for note in notes:
        print(f"tpu-rl doctor: note: {note}", file=sys.stderr)
    return problems


def vm_access_problems(hook: Any, project: str, source_ranges: Sequence[str] | None) -> list[str]:
    """What would stop the TPU VM's SSH sessions in ``project``, as preflight checks it: the
    network, a firewall rule for tcp:22 from ``source_ranges``; OS Login, when enforced, is a note on
    stderr (preflight tests the caller's compute.instances.osAdminLogin)."""
    from airflow_provider_tpu_rl.hooks.vm_access import VmAccessReader
    from airflow_provider_tpu_rl.spec import preflight as checks
    from airflow_provider_tpu_rl.spec import rules

    project = rules.project_id("project", project)
    sources = checks.ssh_source_ranges(source_ranges)
    reader = VmAccessReader(hook, timeout=VM_READ_TIMEOUT)
    enforced, problems = reader.os_login(project)
    if enforced:
        print(
            f"tpu-rl doctor: {checks.os_login_reason(project)}: the run's account needs "
            f"{checks.OS_ADMIN_LOGIN} ({checks.OS_ADMIN_LOGIN_ROLE}); preflight tests it",
            file=sys.stderr,
        )
    return problems + reader.network_problems(project, sources)


# Each gcloud read of the TPU VM checks (``--project``).
VM_READ_TIMEOUT = 180.0
# The runner whose commands each doctor purpose stands for (the wording of the account line).
_PURPOSE_RUNNER = {"deploy": "gke", "jobs": "gke", "tpu_vm": "tpu_vm"}


def credential_problems(hook: Any, chains: Sequence[Any]) -> dict[str, str]:
    """What gcloud and gcluster would refuse for lack of credentials, as preflight checks it: no
    active gcloud account (every purpose's gcloud commands), no Application Default Credentials
    where ``gcluster job submit`` runs (``jobs``; cluster-toolkit cmd/job/prereq.go). Purposes whose
    tools are missing are skipped: their line already says what to install."""
    from airflow_provider_tpu_rl.exceptions import ConfigurationError
    from airflow_provider_tpu_rl.spec import preflight as checks

    ready = [chain.purpose for chain in chains if chain.ok]
    if not ready:
        return {}
    try:
        account = hook.active_gcloud_account()
    except ConfigurationError as err:  # gcloud cannot run
        return dict.fromkeys(ready, str(err))
    found: dict[str, str] = {}
    if account is None:
        for purpose in ready:
            found[purpose] = checks.no_account_problem(checks.runner(_PURPOSE_RUNNER[purpose]))
    if "jobs" in ready and "jobs" not in found:
        from airflow_provider_tpu_rl.toolchain.adc import worker_adc_file

        status = hook.adc_status()
        if not status.ok:
            found["jobs"] = checks.no_adc_problem(status.problem or "", worker_adc_file())
    return found


def conf_keys_help() -> str:
    """``tpu-rl plan --help``'s list of the conf keys of each pipeline, from the run parameters'
    table: key, JSON type, default (``"preset"`` where empty means the preset's value)."""
    lines = ["conf keys (the trigger form's fields; docs/params.md says what each does):"]
    for pipeline, dag_id in ((params.GKE, GKE_DAG_ID), (params.TPU_VM, TPU_VM_DAG_ID)):
        lines.append(f"  {dag_id}:")
        for param in params.params_of(pipeline):
            default = param.default_on(pipeline)
            shown = "empty" if default in (None, "") else json.dumps(default)
            json_type = param.form_field(pipeline)["type"]  # a list: any of them (null last)
            types = (
                [json_type] if isinstance(json_type, str) else sorted(json_type, key=lambda t: t == "null")
            )
            kind = " or ".join(types)
            lines.append(f"    {param.key} ({kind}; default {shown})")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpu-rl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser(
        "plan",
        help="print the commands a DAG run would execute, as JSON (no cloud call)",
        epilog=conf_keys_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument("dag_id", choices=PLAN_DAG_IDS)
    plan.add_argument("--conf", help="the DAG run conf, a JSON object (the DAG params)")
    plan.add_argument("--run-id", default="manual__plan", help="run id the job-name suffix derives from")
    plan.add_argument("--pretty", action="store_true", help="indent the JSON")
    plan.set_defaults(handler=_run_plan)
    doctor = sub.add_parser(
        "doctor",
        help="check gcluster's toolchain (gcluster, Terraform, Packer, git, gcloud, kubectl, "
        "gke-gcloud-auth-plugin): version found, where from, what to do; exit 1 when one is missing",
    )
    doctor.add_argument(
        "--gcluster-conn-id", default="gcluster_default", help="the gcluster connection to use"
    )
    doctor.add_argument(
        "--for", dest="purpose", choices=DOCTOR_PURPOSES, default="all", help="which tasks' tools to check"
    )
    doctor.add_argument(
        "--no-install", action="store_true", help="do not download Terraform/Packer/the gcluster bundle"
    )
    doctor.add_argument(
        "--capacity",
        choices=CAPACITIES,
        help="also check what a TPU VM of this capacity needs of gcloud (flex-start: its alpha component)",
    )
    doctor.add_argument(
        "--project",
        help="also check what the TPU VM's SSH sessions need in this project: the default network, a "
        "firewall rule for tcp:22, OS Login (read-only gcloud calls)",
    )
    doctor.add_argument(
        "--zone",
        help="with --project: also check the zone's region has the quota the default shape needs "
        "(preemptible TPU v6e for --capacity spot or flex-start; N4 CPUs for GKE's cpu-np)",
    )
    doctor.add_argument(
        "--ssh-source-range",
        dest="ssh_source_ranges",
        action="append",
        metavar="CIDR",
        help="where the workers' SSH sessions come from (repeatable; default: any public address)",
    )
    doctor.set_defaults(handler=_run_doctor)
    try:
        from airflow_provider_tpu_rl.ledger.cli import add_runs_subcommand
    except ImportError:  # pragma: no cover
        pass
    else:
        add_runs_subcommand(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = getattr(args, "handler", None) or args.func
    return int(handler(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
