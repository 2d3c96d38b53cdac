"""docs/operators.md's DAG: it parses, the guide quotes it exactly, and it runs in the sandbox."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.docs.conftest import EXAMPLES_DIR, REPO
from tests.support.harness import DagRunResult, E2EWorld
from tpu_rl_sandbox.commands.lifecycle import SANDBOX_PROJECT

GUIDE = REPO / "docs" / "operators.md"
EXAMPLE = EXAMPLES_DIR / "tpu_rl_own_dag.py"
DAG_ID = "tpu_rl_own_dag"
MODEL = "qwen3-30b-a3b"
# No "project": the DAG's empty default makes every task use the GCP connection's project.
CONF = {
    "bucket": "tpu-rl-docs-guide",
    "cluster_name": "docs-guide",
    "run_name": "guide-run",
    "num_batches": 3,
    "learning_rate": 1e-6,
}
TASKS = {
    "ensure_bucket",
    "deploy_cluster",
    "sync_hf_token",
    "convert_to_maxtext",
    "train",
    "wait_actor_checkpoint",
    "destroy_cluster",
}
# In the DAG file: "# [guide:NAME]" ... "# [/guide:NAME]"; in the guide: the same lines, fenced,
# right after "<!-- excerpt: docs/examples/tpu_rl_own_dag.py NAME -->".
_FILE_EXCERPT = re.compile(
    r"^ *# \[guide:(?P<name>[\w-]+)\]\n(?P<body>.*?)^ *# \[/guide:(?P=name)\]\n", re.M | re.S
)
_GUIDE_EXCERPT = re.compile(
    rf"^<!-- excerpt: {re.escape(str(EXAMPLE.relative_to(REPO)))} (?P<name>[\w-]+) -->\n"
    r"```python\n(?P<body>.*?)^```$",
    re.M | re.S,
)


def _dedent_block(text: str) -> str:
    lines = text.splitlines()
    indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return "\n".join(line[indent:] if line.strip() else "" for line in lines).strip("\n")


def _file_excerpts() -> dict[str, str]:
    text = EXAMPLE.read_text()
    return {m["name"]: m["body"] for m in _FILE_EXCERPT.finditer(text)}


# ------------------------------------------------------------------------------------ fast checks
def test_the_example_dag_parses_without_import_errors() -> None:
    from tests.support.compat import make_dag_bag

    bag = make_dag_bag(str(EXAMPLES_DIR))
    assert bag.import_errors == {}, bag.import_errors
    assert sorted(bag.dags) == [DAG_ID]
    dag = bag.dags[DAG_ID]
    assert {task.task_id for task in dag.tasks} == TASKS
    assert dag.get_task("destroy_cluster").is_teardown
    assert dag.get_task("convert_to_maxtext").deferrable
    assert dag.get_task("train").deferrable
    for task in dag.tasks:  # the google provider's conventions reach every task
        assert task.impersonation_chain == "{{ params.impersonation_chain }}", task.task_id
        assert task.project_id in ("{{ params.project }}", None), task.task_id
    assert dag.params["project"] == ""
    assert dag.params["impersonation_chain"] == ""


def test_the_guide_quotes_the_example_exactly() -> None:
    in_file = _file_excerpts()
    in_guide = {m["name"]: m["body"] for m in _GUIDE_EXCERPT.finditer(GUIDE.read_text())}
    assert in_file, f"{EXAMPLE.name} marks no excerpt"
    assert set(in_guide) == set(in_file), "the guide quotes each marked excerpt of the example once"
    for name, body in in_file.items():
        assert in_guide[name].strip("\n") == _dedent_block(body), f"excerpt {name!r} differs from the file"


def test_the_excerpts_cover_every_operator_of_the_example() -> None:
    quoted = "".join(_file_excerpts().values())
    for task_id in TASKS:
        assert f'task_id="{task_id}"' in quoted, task_id


# ----------------------------------------------------------------------------------- the sandbox run
@pytest.fixture(scope="module")
def guide_run(examples_world: E2EWorld) -> DagRunResult:
    return examples_world.run_dag(DAG_ID, CONF)


def _xcom(world: E2EWorld, run: DagRunResult, task_id: str) -> Any:
    import json

    rows = world.metadata(
        "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ? AND key = 'return_value'",
        (DAG_ID, run.run_id, task_id),
    )
    assert rows, f"no return_value XCom of {task_id}"
    value = rows[0][0]
    return json.loads(value if isinstance(value, str) else bytes(value).decode())


@pytest.mark.e2e
def test_the_guide_dag_succeeds_in_the_sandbox(guide_run: DagRunResult) -> None:
    assert guide_run.exit_code == 0, guide_run.describe()
    assert guide_run.state == "success", guide_run.describe()
    assert {t: r.state for t, r in guide_run.tasks.items()} == dict.fromkeys(TASKS, "success"), (
        guide_run.describe()
    )


@pytest.mark.e2e
def test_the_cluster_was_deployed_and_destroyed(examples_world: E2EWorld, guide_run: DagRunResult) -> None:
    deploys = guide_run.calls_of("gcluster", "deploy")
    destroys = guide_run.calls_of("gcluster", "destroy")
    assert [call.exit_code for call in deploys] == [0], guide_run.describe()
    assert [call.exit_code for call in destroys] == [0], guide_run.describe()
    assert CONF["cluster_name"] not in examples_world.live_clusters()
    destroyed = _xcom(examples_world, guide_run, "destroy_cluster")
    assert destroyed["destroyed"] is True
    assert destroyed["lease_holder"] == guide_run.ledger_run_id
    # the lease was released: no run holds the cluster any more
    assert not examples_world.exists(f"gs://{CONF['bucket']}/tpu-rl/leases/{CONF['cluster_name']}.json")


@pytest.mark.e2e
def test_the_jobs_ran_and_the_sensor_found_the_checkpoint(
    examples_world: E2EWorld, guide_run: DagRunResult
) -> None:
    submits = guide_run.calls_of("gcluster", "job", "submit")
    assert len(submits) == 2, guide_run.describe()  # the conversion, then the training
    # the project came from google_cloud_default, the DAG's project param being empty
    assert [call.flag("project") for call in submits] == [SANDBOX_PROJECT] * 2, guide_run.describe()
    assert re.search(r"learning_rate=1e-0?6\b", str(submits[1].flag("command"))), guide_run.describe()
    step_folder = f"gs://{CONF['bucket']}/{MODEL}/trained/guide-run/checkpoints/actor/3"
    assert "commit_success.txt" in examples_world.objects(step_folder)
    found = _xcom(examples_world, guide_run, "wait_actor_checkpoint")
    assert found["status"] == "success"
    assert found["step"] == 3
    assert found["checkpoint_uri"].startswith(step_folder + "/")
    assert "Found checkpoint step 3" in guide_run.output
    trained = _xcom(examples_world, guide_run, "train")
    assert trained["skipped"] is False
    assert trained["metrics"]["last_step"] == 3
