"""The argument parsers follow cobra/pflag (gcluster), gcloud and Go's duration rules."""

from __future__ import annotations

import pytest

from tpu_rl_sandbox.clis.gcloud.commands import COMMANDS
from tpu_rl_sandbox.clis.gcloud.parser import GcloudUsageError, gcloud_parse, gcloud_resolve
from tpu_rl_sandbox.clis.gcluster.cobra import CobraError, CobraHelp, cobra_parse, required_flags_error
from tpu_rl_sandbox.clis.gcluster.commands import build_tree
from tpu_rl_sandbox.clis.gcluster.gotime import GoDurationError, duration_to_seconds_or_int, parse_duration


def test_vars_split_on_commas_and_accumulate_when_repeated() -> None:
    parsed = cobra_parse(
        build_tree(), ["deploy", "bp.yaml", "--vars", "a=1,b=2", "--vars=c=3", "--backend-config", "bucket=x"]
    )
    assert parsed.get("vars") == ["a=1", "b=2", "c=3"]
    assert parsed.get("backend-config") == ["bucket=x"]
    assert parsed.args == ["bp.yaml"]


def test_shorthand_flags_value_forms_and_bool_cluster() -> None:
    parsed = cobra_parse(build_tree(), ["deploy", "-l", "IGNORE", "-w", "bp.yaml", "-oout"])
    assert parsed.get("validation-level") == "IGNORE"
    assert parsed.get("overwrite-deployment") is True
    assert parsed.get("out") == "out"
    clustered = cobra_parse(build_tree(), ["deploy", "-wl", "WARNING", "bp.yaml"])
    assert clustered.get("overwrite-deployment") is True
    assert clustered.get("validation-level") == "WARNING"


def test_bool_takes_a_value_only_with_equals() -> None:
    parsed = cobra_parse(build_tree(), ["deploy", "bp.yaml", "--auto-approve=false"])
    assert parsed.get("auto-approve") is False
    with pytest.raises(CobraError, match=r"accepts 1 arg\(s\), received 2"):
        cobra_parse(build_tree(), ["deploy", "bp.yaml", "--auto-approve", "false"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["deploy", "bp.yaml", "--bogus"], "unknown flag: --bogus"),
        (["deploy", "bp.yaml", "-z"], "unknown shorthand flag: 'z' in -z"),
        (["deploy", "bp.yaml", "--out"], "flag needs an argument: --out"),
        (["job", "submit", "-n"], "flag needs an argument: 'n' in -n"),
        (["job", "submit", "--num-slices", "two"], 'invalid argument "two" for "--num-slices" flag'),
        (["deplooy"], 'unknown command "deplooy" for "gcluster"'),
        (["job", "logs"], r"accepts 1 arg(s), received 0"),
    ],
)
def test_cobra_errors(argv: list[str], message: str) -> None:
    with pytest.raises(CobraError) as raised:
        cobra_parse(build_tree(), argv)
    assert message in raised.value.message


def test_job_persistent_flags_are_inherited_and_help_is_not_an_error() -> None:
    parsed = cobra_parse(build_tree(), ["job", "list", "-p", "proj", "-c", "clu", "-l", "us-east5"])
    assert (parsed.get("project"), parsed.get("cluster"), parsed.get("location")) == (
        "proj",
        "clu",
        "us-east5",
    )
    with pytest.raises(CobraHelp):
        cobra_parse(build_tree(), ["job"])


def test_required_flags_are_reported_sorted_like_pflag() -> None:
    parsed = cobra_parse(build_tree(), ["job", "submit", "--image", "img"])
    error = required_flags_error(parsed, ("name", "command", "compute-type"))
    assert error is not None
    assert error.message == 'required flag(s) "command", "compute-type", "name" not set'


def test_env_flags_repeat_without_splitting_on_commas() -> None:
    parsed = cobra_parse(build_tree(), ["job", "submit", "--env", "JAX_PLATFORMS=proxy,cpu", "--env=A=1"])
    assert parsed.get("env") == ["JAX_PLATFORMS=proxy,cpu", "A=1"]


def test_gcloud_rules() -> None:
    command, rest = gcloud_resolve(
        COMMANDS, ["storage", "buckets", "create", "gs://b", "--project", "p", "--location=us"]
    )
    parsed = gcloud_parse(command, rest)
    assert parsed.get("project") == "p"
    assert parsed.get("location") == "us"
    assert parsed.positionals["URL"] == ["gs://b"]
    with pytest.raises(GcloudUsageError) as unknown:
        gcloud_parse(command, ["gs://b", "--bogus=1"])
    assert unknown.value.render().startswith(
        "ERROR: (gcloud.storage.buckets.create) unrecognized arguments: --bogus=1"
    )
    binding, rest = gcloud_resolve(COMMANDS, ["projects", "add-iam-policy-binding", "p", "--role=roles/x"])
    with pytest.raises(GcloudUsageError, match="argument --member: Must be specified"):
        gcloud_parse(binding, rest)
    create, rest = gcloud_resolve(
        COMMANDS, ["compute", "instances", "create", "vm", "--maintenance-policy=SOMETIMES"]
    )
    with pytest.raises(GcloudUsageError, match="Invalid choice: 'SOMETIMES'"):
        gcloud_parse(create, rest)
    with pytest.raises(GcloudUsageError, match="Invalid choice: 'bukets'"):
        gcloud_resolve(COMMANDS, ["storage", "bukets", "create"])


def test_go_durations() -> None:
    assert parse_duration("24h") == 86400
    assert parse_duration("1h30m") == 5400
    assert parse_duration("-1s") == -1
    assert parse_duration("1.5s") == 1.5
    with pytest.raises(GoDurationError, match='missing unit in duration "3600"'):
        parse_duration("3600")
    with pytest.raises(GoDurationError, match="invalid duration"):
        parse_duration("soon")
    # gcluster's TTL parser falls back to integer seconds.
    assert duration_to_seconds_or_int("3600", "--gke-ttl-after-finished") == 3600
    with pytest.raises(ValueError, match="invalid duration format for --gke-ttl-after-finished: soon"):
        duration_to_seconds_or_int("soon", "--gke-ttl-after-finished")
