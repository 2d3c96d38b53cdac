"""The janitor DAG: schedule, params, and its thin loop over the janitor functions (faked here)."""

from __future__ import annotations

import inspect
import itertools
import json
import sys
import types
from datetime import UTC, datetime
from typing import Any

import pytest
from croniter import croniter

from airflow_provider_tpu_rl.compat import AirflowException, AirflowFailException
from airflow_provider_tpu_rl.spec import rules
from tests.support.compat import dag_schedule
from tests.support.dags import JANITOR_DAG_ID

JANITOR_MODULE = "airflow_provider_tpu_rl.operators.janitor"


@pytest.fixture
def janitor(dag_bag: Any) -> Any:
    return dag_bag.dags[JANITOR_DAG_ID]


def test_runs_every_30_minutes_one_run_at_a_time(janitor: Any) -> None:
    assert janitor.catchup is False
    assert janitor.max_active_runs == 1
    fires = croniter(dag_schedule(janitor), datetime(2026, 3, 1, 0, 7, tzinfo=UTC))
    times = [fires.get_next(datetime) for _ in range(49)]
    assert {(b - a).total_seconds() for a, b in itertools.pairwise(times)} == {1800.0}


def test_params_are_a_form(janitor: Any) -> None:
    janitor.params.validate()
    projects = janitor.params.get_param("projects").schema
    # the rule is the task's, in one line (Airflow would refuse a pattern with the schema dumped)
    assert projects["items"] == {"type": "string"}
    assert f"Rule: {rules.PROJECT_ID_RULE}" in janitor.params.get_param("projects").description
    janitor.params.get_param("projects").resolve(["Bad_Project"])
    assert projects["title"]
    assert janitor.params.get_param("dry_run").schema["type"] == "boolean"
    assert janitor.params["dry_run"] is False


class FakeJanitor:
    """Expired resources per project; destroying a resource named in ``broken`` raises, and so
    does scanning a project named in ``unreadable``. The projects come from the real
    ``discover_sources`` (no bucket, no ledger) unless ``record_projects`` names more."""

    def __init__(
        self,
        expired: dict[str, list[dict[str, str]]],
        broken: frozenset[str] = frozenset(),
        *,
        record_projects: tuple[str, ...] = (),
        unreadable: frozenset[str] = frozenset(),
    ) -> None:
        self.expired = expired
        self.broken = broken
        self.record_projects = record_projects
        self.unreadable = unreadable
        self.scanned: list[tuple[Any, str, int]] = []
        self.scan_options: list[dict[str, Any]] = []
        self.destroyed: list[str] = []
        self.destroy_options: list[dict[str, Any]] = []
        self.probe = object()
        self.closed: list[tuple[list[Any], Any]] = []
        self.ledger_broken = False

    def discover_sources(self, projects: list[str], *, gcp_conn_id: str) -> Any:
        from airflow_provider_tpu_rl.records.janitor_sources import JanitorSources, discover_sources

        if self.record_projects and not projects:
            return JanitorSources(list(self.record_projects), ["bkt-records"])
        return discover_sources(projects, gcp_conn_id=gcp_conn_id, buckets=[])

    def run_probe(self, context: Any) -> Any:
        return self.probe

    def find_expired_resources(
        self, hook: Any, project: str, now: int, **options: Any
    ) -> list[dict[str, str]]:
        self.scanned.append((hook, project, now))
        self.scan_options.append(options)
        if project in self.unreadable:
            raise RuntimeError(f"cannot list {project}")
        return self.expired.get(project, [])

    def destroy_resource(self, hook: Any, resource: dict[str, str], **options: Any) -> None:
        self.destroy_options.append(options)
        if resource["name"] in self.broken:
            raise RuntimeError(f"destroy of {resource['name']} failed")
        self.destroyed.append(resource["name"])
        return None if resource["kind"] == "tpu_vm" else f"end of {resource['name']}"

    def close_ledger_rows(self, ends: list[Any], runs: Any) -> list[str]:
        self.closed.append((list(ends), runs))
        if self.ledger_broken:
            raise RuntimeError("ledger unreachable")
        return [f"closed {end}" for end in ends]


@pytest.fixture
def run_janitor(janitor: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Call the janitor task's function with the given params and a fake janitor module."""
    function = janitor.get_task("destroy_expired").python_callable

    def run(fake: FakeJanitor, **params: Any) -> dict[str, list[Any]]:
        module = types.ModuleType(JANITOR_MODULE)
        for name in (
            "find_expired_resources",
            "destroy_resource",
            "discover_sources",
            "run_probe",
            "close_ledger_rows",
        ):
            setattr(module, name, getattr(fake, name))
        monkeypatch.setitem(sys.modules, JANITOR_MODULE, module)
        # The ledger of this test session names no bucket.
        monkeypatch.setattr(
            "airflow_provider_tpu_rl.records.janitor_sources.ledger_buckets", lambda *a, **k: []
        )
        monkeypatch.setitem(
            function.__globals__,
            "get_current_context",
            lambda: {"params": {"projects": [], "dry_run": False, **params}, "run_id": "scheduled__janitor"},
        )
        monkeypatch.setitem(function.__globals__, "GclusterHook", lambda **kwargs: ("hook", kwargs))
        return function()

    return run


EXPIRED = {
    "proj-one-1": [{"kind": "gke", "name": "tpu-rl"}, {"kind": "tpu_vm", "name": "tpu-rl-vm"}],
    "proj-two-2": [{"kind": "gke", "name": "old-rl"}],
}


def test_destroys_every_expired_resource_of_every_project(run_janitor: Any) -> None:
    fake = FakeJanitor(EXPIRED)
    report = run_janitor(fake, projects=["proj-one-1", "proj-two-2"])
    assert fake.destroyed == ["tpu-rl", "tpu-rl-vm", "old-rl"]
    assert [project for _, project, _ in fake.scanned] == ["proj-one-1", "proj-two-2"]
    assert all(hook == ("hook", {"gcluster_conn_id": "gcluster_default"}) for hook, _, _ in fake.scanned)
    assert len(report["found"]) == len(report["destroyed"]) == 3
    assert report["failed"] == []
    assert report["closed"] == ["closed end of tpu-rl", "closed end of old-rl"]
    json.dumps(report)  # the XCom must be JSON


@pytest.mark.parametrize(
    ("projects", "said"),
    [
        (["proj-one-1", "Bad_Project"], f"projects: {rules.PROJECT_ID_RULE} (got 'Bad_Project')"),
        (["proj-one-1", "proj-one-1"], "projects: each project once ('proj-one-1' is named twice)"),
    ],
)
def test_bad_projects_are_refused_in_one_line_before_any_scan(
    run_janitor: Any, projects: list[str], said: str
) -> None:
    fake = FakeJanitor(EXPIRED)
    with pytest.raises(AirflowFailException) as refused:
        run_janitor(fake, projects=projects)
    assert str(refused.value) == said
    assert fake.scanned == []
    assert fake.destroyed == []


def test_scan_time_is_now(run_janitor: Any) -> None:
    fake = FakeJanitor({})
    before = int(datetime.now(UTC).timestamp())
    run_janitor(fake, projects=["proj-one-1"])
    after = int(datetime.now(UTC).timestamp())
    assert before <= fake.scanned[0][2] <= after


def test_one_failed_destroy_does_not_stop_the_others_but_fails_the_run(run_janitor: Any) -> None:
    fake = FakeJanitor(EXPIRED, broken=frozenset({"tpu-rl"}))
    with pytest.raises(AirflowException, match="1 expired resource"):
        run_janitor(fake, projects=["proj-one-1", "proj-two-2"])
    assert fake.destroyed == ["tpu-rl-vm", "old-rl"]


def test_the_ledger_rows_of_the_runs_it_ended_are_closed_after_the_destroys(run_janitor: Any) -> None:
    fake = FakeJanitor(EXPIRED, broken=frozenset({"old-rl"}))
    with pytest.raises(AirflowException, match="1 expired resource"):
        run_janitor(fake, projects=["proj-one-1", "proj-two-2"])
    # one close after every destroy: the ends of those destroyed (a failed destroy ended nothing),
    # and the probe, which finds the rows of DAG runs that ended
    assert fake.closed == [(["end of tpu-rl"], fake.probe)]


def test_a_ledger_that_cannot_be_closed_fails_the_run_after_the_destroys(run_janitor: Any) -> None:
    fake = FakeJanitor(EXPIRED)
    fake.ledger_broken = True
    with pytest.raises(AirflowException, match="1 expired resource"):
        run_janitor(fake, projects=["proj-one-1", "proj-two-2"])
    assert fake.destroyed == ["tpu-rl", "tpu-rl-vm", "old-rl"]


def test_dry_run_destroys_nothing(run_janitor: Any) -> None:
    fake = FakeJanitor(EXPIRED)
    report = run_janitor(fake, projects=["proj-one-1"], dry_run=True)
    assert fake.closed == []  # nor closes a ledger row
    assert fake.destroyed == []
    assert [r["name"] for r in report["found"]] == ["tpu-rl", "tpu-rl-vm"]
    assert report["destroyed"] == []


def test_without_projects_it_scans_the_connections_project(
    run_janitor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
        json.dumps(
            {
                "conn_type": "google_cloud_platform",
                "extra": {"is_anonymous": True, "project": "conn-project-9"},
            }
        ),
    )
    fake = FakeJanitor({})
    run_janitor(fake)
    assert [project for _, project, _ in fake.scanned] == ["conn-project-9"]


def test_the_provider_janitor_functions_have_the_signatures_the_dag_calls() -> None:
    module = __import__(
        JANITOR_MODULE,
        fromlist=["find_expired_resources", "destroy_resource", "discover_sources", "run_probe"],
    )
    inspect.signature(module.close_ledger_rows).bind([], None)
    find = inspect.signature(module.find_expired_resources)
    assert list(find.parameters)[:3] == ["hook", "project", "now"]
    find.bind("hook", "project", 0, runs=None, sources=None, gcp_conn_id="google_cloud_default")
    assert "run_state" in find.parameters
    destroy = inspect.signature(module.destroy_resource)
    destroy.bind("hook", "resource")
    destroy.bind("hook", "resource", gcp_conn_id="google_cloud_default", janitor_run_id="scheduled__x")
    inspect.signature(module.discover_sources).bind([], gcp_conn_id="google_cloud_default")
    inspect.signature(module.run_probe).bind({})


def test_without_projects_it_scans_every_project_the_records_name(run_janitor: Any) -> None:
    fake = FakeJanitor(EXPIRED, record_projects=("proj-one-1", "proj-two-2"))
    report = run_janitor(fake)
    assert [project for _, project, _ in fake.scanned] == ["proj-one-1", "proj-two-2"]
    assert fake.destroyed == ["tpu-rl", "tpu-rl-vm", "old-rl"]
    assert len(report["destroyed"]) == 3


def test_the_scan_reads_run_states_and_finds_records_through_the_sources(run_janitor: Any) -> None:
    fake = FakeJanitor(EXPIRED, record_projects=("proj-one-1",))
    run_janitor(fake)
    (options,) = fake.scan_options
    assert options["runs"] is fake.probe
    assert options["sources"].projects == ["proj-one-1"]
    assert options["sources"].buckets == ["bkt-records"]
    # the janitor takes a cluster's lease under its own run id before destroying it
    assert {o["janitor_run_id"] for o in fake.destroy_options} == {"scheduled__janitor"}


def test_a_project_that_cannot_be_scanned_does_not_stop_the_others_but_fails_the_run(
    run_janitor: Any,
) -> None:
    fake = FakeJanitor(EXPIRED, unreadable=frozenset({"proj-one-1"}))
    with pytest.raises(AirflowException, match="1 expired resource"):
        run_janitor(fake, projects=["proj-one-1", "proj-two-2"])
    assert fake.destroyed == ["old-rl"]


def test_without_projects_and_without_a_connection_project_it_fails(
    run_janitor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
        json.dumps({"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True}}),
    )
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    fake = FakeJanitor(EXPIRED)
    with pytest.raises(AirflowException, match="names no project"):
        run_janitor(fake)
    assert fake.scanned == []
