"""gcluster's job prerequisite check kept between a worker's job sessions (toolchain/job_prereqs.py):
through the hook's sessions against the fake gcluster, per environment, for an hour, never from a
store another user can write."""

from __future__ import annotations

import os
import time

from airflow_provider_tpu_rl.render.command import Command

GUARD = 30.0  # seconds: only reached when the code under test hangs
STATE = ".gcluster/job_prereq_state.json"


def test_a_job_submit_finds_the_prerequisite_state_an_earlier_session_s_check_left(
    make_hook, fake_tools, monkeypatch, tmp_path, recording_logger
):
    """gcluster skips its prerequisite check when HOME holds a recent state file (cmd/job/prereq.go);
    each task's session has a fresh HOME, so the hook carries the file over, per environment."""
    from airflow_provider_tpu_rl.toolchain import job_prereqs

    monkeypatch.setattr(job_prereqs, "store_dir", lambda: tmp_path / "kept")
    fake_tools.respond(
        {"match": ["submit"], "steps": [["cat_home", STATE], ["write_home", STATE, '{"checked": 1}']]},
        {"match": ["list"], "steps": []},
    )
    hook = make_hook()
    submit = Command(("gcluster", "job", "submit", "--name=a"))

    def session_sees(command: Command = submit) -> str:
        with hook.job_session() as home:
            return hook.run(command, job_home=home, timeout=GUARD).output_lines[0]

    said = "gcluster's prerequisite check passed within the hour here: not repeated"
    assert session_sees() == "missing"  # the first check runs
    assert said not in recording_logger.messages
    assert session_sees() == '{"checked": 1}'  # the next session starts with its result
    assert said in recording_logger.messages
    assert (tmp_path / "kept").stat().st_mode & 0o777 == 0o700
    with hook.job_session() as home:  # not a submit: nothing carried over
        assert hook.run(Command(("gcluster", "job", "list")), job_home=home, timeout=GUARD).ok
        assert not (home / STATE).exists()

    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "other")  # another environment: checked again
    assert session_sees() == "missing"
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT")

    stale = time.time() - job_prereqs.REUSE_SECONDS - 1
    for path in (tmp_path / "kept").glob("*.json"):
        os.utime(path, (stale, stale))
    assert session_sees() == "missing"  # older than REUSE_SECONDS: gcluster checks again


def test_a_failed_submit_leaves_no_state_for_the_next_session(make_hook, fake_tools, monkeypatch, tmp_path):
    from airflow_provider_tpu_rl.toolchain import job_prereqs

    monkeypatch.setattr(job_prereqs, "store_dir", lambda: tmp_path / "kept")
    fake_tools.respond(
        {"match": ["submit"], "steps": [["cat_home", STATE], ["write_home", STATE, "{}"]], "exit": 1},
    )
    hook = make_hook()
    for _ in range(2):
        with hook.job_session() as home:
            result = hook.run(
                Command(("gcluster", "job", "submit", "--name=a")), job_home=home, timeout=GUARD
            )
            assert result.output_lines[0] == "missing"
    assert not list((tmp_path / "kept").glob("*.json"))


def test_a_prerequisite_store_another_user_can_write_is_not_used(tmp_path, monkeypatch):
    from airflow_provider_tpu_rl.toolchain import job_prereqs

    store = tmp_path / "kept"
    store.mkdir(mode=0o777)
    store.chmod(0o777)
    monkeypatch.setattr(job_prereqs, "store_dir", lambda: store)
    home = tmp_path / "home"
    (home / ".gcluster").mkdir(parents=True)
    (home / STATE).write_text("{}")
    env = {"PATH": "/bin"}
    assert not job_prereqs.keep(home, env)
    (store / f"{job_prereqs.environment_key(env)}.json").write_text("{}")
    fresh = tmp_path / "fresh"
    assert not job_prereqs.seed(fresh, env)
    assert not (fresh / STATE).exists()


def test_the_prerequisite_state_is_kept_per_tool_path_gcloud_config_and_adc() -> None:
    from airflow_provider_tpu_rl.toolchain.job_prereqs import environment_key

    base = {"PATH": "/usr/bin", "CLOUDSDK_CONFIG": "/g", "HOME": "/h1", "LANG": "C"}
    assert environment_key(base) == environment_key({**base, "HOME": "/h2", "LANG": "C.UTF-8"})
    for changed in (
        {"PATH": "/opt/bin:/usr/bin"},
        {"CLOUDSDK_CONFIG": "/other"},
        {"CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT": "sa@p.iam.gserviceaccount.com"},
        {"GOOGLE_APPLICATION_CREDENTIALS": "/key.json"},
        {"DOCKER_CONFIG": "/d"},
        {"HTTPS_PROXY": "http://proxy:3128"},
    ):
        assert environment_key({**base, **changed}) != environment_key(base), changed
