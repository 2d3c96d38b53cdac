"""``RunDirRecords`` against the real fake-gcs-server emulator (it honours ifGenerationMatch):
one writer per run directory, whatever cluster its job runs on."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace

import pytest

from airflow_provider_tpu_rl.exceptions import RunDirBusyError
from airflow_provider_tpu_rl.maxtext.layout import RUN_DIR_PREFIX, run_dir, run_record_object
from airflow_provider_tpu_rl.records.run_dirs import (
    MAX_ATTEMPTS,
    RunDirRecord,
    RunDirRecords,
    TrainingAttempt,
    WriterClaim,
    attempt_from_log,
    claim_kept_alive,
    vouches,
)
from tests.support.gcs_emulator import EMULATOR_BUCKET, GcsEmulator

pytestmark = pytest.mark.usefixtures("gcs_emulator")
BUCKET = EMULATOR_BUCKET
SETTINGS = {"model_name": "gemma4-26b", "learning_rate": "2e-05"}


@pytest.fixture
def directory() -> str:
    return f"gs://{BUCKET}/gemma4-26b/trained/rl-{uuid.uuid4().hex[:8]}"


def writer(run: str, job: str = "job-1", where: str = "p/us-east5/c1", seconds: float = 600) -> WriterClaim:
    return WriterClaim(run, job, where, time.time() + seconds)


def test_one_object_per_directory_whatever_its_spelling(directory: str) -> None:
    assert run_record_object(directory) == run_record_object(directory + "/")
    assert run_record_object(directory).startswith(RUN_DIR_PREFIX)
    assert run_dir(directory) == directory + "/"


def test_claim_records_the_runs_and_keeps_the_first_settings(directory: str) -> None:
    records = RunDirRecords()
    assert records.read(BUCKET, directory) == RunDirRecord(run_dir(directory))
    first = records.claim(BUCKET, directory, run="d/r1", settings=SETTINGS, writer=writer("d/r1"))
    assert first.runs == ("d/r1",)
    assert first.writer is not None
    assert first.writer.job == "job-1"
    records.release(BUCKET, directory, run="d/r1", job="job-1")
    second = records.claim(
        BUCKET, directory, run="d/r2", settings={"model_name": "other"}, writer=writer("d/r2", "job-2")
    )
    assert second.runs == ("d/r1", "d/r2")
    assert second.settings == SETTINGS  # what the directory was started with
    assert second.before("d/r2") == "d/r1"
    assert records.read(BUCKET, directory) == second


def test_a_live_claim_of_another_run_refuses_and_writes_nothing(directory: str) -> None:
    records = RunDirRecords()
    held = records.claim(BUCKET, directory, run="d/r1", settings=SETTINGS, writer=writer("d/r1"))
    with pytest.raises(RunDirBusyError) as busy:
        records.claim(
            BUCKET, directory, run="d/r2", settings=SETTINGS, writer=writer("d/r2", where="p/europe-west4/c2")
        )
    assert busy.value.writer == held.writer
    message = str(busy.value)
    assert message.startswith(
        f"{run_dir(directory)} is being written by job job-1 (p/us-east5/c1) of run d/r1"
    )
    assert "never two jobs on one directory" in message
    assert records.read(BUCKET, directory) == held
    # recording a run without claiming (adopting a complete output) is not writing: allowed
    assert records.claim(BUCKET, directory, run="d/r3", settings=SETTINGS, writer=None).writer == held.writer


def test_an_expired_claim_is_taken_over_only_as_the_exact_claim_proven_dead(directory: str) -> None:
    """A claim that expired (or whose run ended) no longer vouches for its job, but a crash leaves
    the job running: the record is handed over only for the claim the caller proved dead, with
    the attempt that job made; a claim renewed meanwhile (its job alive after all) is not."""
    records = RunDirRecords()
    records.claim(BUCKET, directory, run="d/r1", settings=SETTINGS, writer=writer("d/r1", seconds=-1))
    expired = records.read(BUCKET, directory).writer
    assert expired is not None
    assert expired.expired()
    assert vouches(expired, run_ended=False) is False
    with pytest.raises(RunDirBusyError):  # expired alone is no proof
        records.claim(BUCKET, directory, run="d/r2", settings=SETTINGS, writer=writer("d/r2"))
    renewed = replace(expired, expires_at=time.time() + 600)
    with pytest.raises(RunDirBusyError):  # proven dead: a claim that is no longer the one held
        records.claim(
            BUCKET, directory, run="d/r2", settings=SETTINGS, writer=writer("d/r2"), takeover=renewed
        )
    killed = TrainingAttempt("d/r1", "job-1", 0, 14, 100.0, 200.0)
    taken = records.claim(
        BUCKET,
        directory,
        run="d/r2",
        settings=SETTINGS,
        writer=writer("d/r2", where="p/europe-west4/c2"),
        takeover=expired,
        displaced=killed,
    )
    assert taken.writer is not None
    assert (taken.writer.run, taken.writer.where) == ("d/r2", "p/europe-west4/c2")
    assert taken.attempts == (killed,)
    assert taken.runs == ("d/r1", "d/r2")
    assert records.read(BUCKET, directory) == taken


def test_a_claim_names_its_platform_and_place() -> None:
    gke = WriterClaim("d/r1", "train-abc123", "proj/us-east5/c1", 1.0)
    vm = WriterClaim("d/r1", "vm-1/train", "proj/us-east5-b/vm-1", 1.0)
    assert (gke.platform, gke.place) == ("gke", ("proj", "us-east5", "c1"))
    assert (vm.platform, vm.place) == ("vm", ("proj", "us-east5-b", "vm-1"))
    assert WriterClaim.from_dict(gke.as_dict()) == gke
    assert WriterClaim.from_dict({**vm.as_dict(), "platform": None}) == vm  # a claim of before
    assert WriterClaim("d/r1", "j", "not-a-place", 1.0).place is None


def test_renew_and_release_touch_only_the_holders_claim(directory: str) -> None:
    records = RunDirRecords()
    claimed = records.claim(
        BUCKET, directory, run="d/r1", settings=SETTINGS, writer=writer("d/r1", seconds=60)
    )
    assert claimed.writer is not None
    later = time.time() + 3600
    assert records.renew(BUCKET, directory, run="d/r1", job="job-1", until=later) is True
    renewed = records.read(BUCKET, directory).writer
    assert renewed is not None
    assert renewed.expires_at == pytest.approx(later)
    assert (
        records.renew(BUCKET, directory, run="d/r1", job="job-1", until=later - 600) is True
    )  # never shortened
    assert records.read(BUCKET, directory).writer == renewed
    assert records.renew(BUCKET, directory, run="d/r2", job="job-1", until=later + 60) is False
    assert records.renew(BUCKET, directory, run="d/r1", job="other-job", until=later + 60) is False
    records.release(BUCKET, directory, run="d/r2")  # not the holder: nothing happens
    assert records.read(BUCKET, directory).writer == renewed
    records.release(BUCKET, directory, run="d/r1", job="job-1")
    assert records.read(BUCKET, directory).writer is None
    assert records.renew(BUCKET, directory, run="d/r1", job="job-1", until=later) is False


def test_racing_claims_exactly_one_wins(directory: str) -> None:
    runs = [f"d/r{i}" for i in range(6)]
    start = threading.Barrier(len(runs))
    won: list[RunDirRecord] = []
    refused: list[RunDirBusyError] = []

    def contend(run: str) -> None:
        records = RunDirRecords()
        records.read(BUCKET, "gs://warm/up")  # connect before the barrier
        start.wait(timeout=30)
        try:
            won.append(records.claim(BUCKET, directory, run=run, settings=SETTINGS, writer=writer(run)))
        except RunDirBusyError as err:
            refused.append(err)

    threads = [threading.Thread(target=contend, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(won) == 1, (won, refused)
    assert len(refused) == len(runs) - 1
    winner = won[0].writer
    assert winner is not None
    assert all(err.writer == winner for err in refused)
    assert RunDirRecords().read(BUCKET, directory).writer == winner


def test_a_damaged_record_reads_as_unrecorded(directory: str) -> None:
    GcsEmulator(url="", bucket_name=BUCKET).upload([run_record_object(directory)], b"not json")
    record = RunDirRecords().read(BUCKET, directory)
    assert (record.runs, record.writer) == ((), None)
    assert record.generation > 0
    claimed = RunDirRecords().claim(BUCKET, directory, run="d/r1", settings=SETTINGS, writer=writer("d/r1"))
    assert claimed.runs == ("d/r1",)


def test_a_claim_is_kept_alive_while_a_long_call_runs(directory: str) -> None:
    records = RunDirRecords()
    claimed = records.claim(
        BUCKET, directory, run="d/r1", settings=SETTINGS, writer=writer("d/r1", seconds=1)
    )
    assert claimed.writer is not None
    with claim_kept_alive(records, BUCKET, directory, run="d/r1", job="job-1", seconds=1.2):
        time.sleep(2.0)  # a VM stage over SSH: longer than the claim's own life
        held = records.read(BUCKET, directory).writer
        assert held is not None
        assert not held.expired()
        assert held.expires_at > claimed.writer.expires_at
    after = records.read(BUCKET, directory).writer
    time.sleep(0.6)
    assert records.read(BUCKET, directory).writer == after  # stopped with the block


def test_a_training_attempt_is_recorded_when_its_claim_is_released(directory: str) -> None:
    records = RunDirRecords()
    first = TrainingAttempt("d/r1", "job-1", 0, 13, 1000.0, 1600.0)
    records.claim(BUCKET, directory, run="d/r1", settings=SETTINGS, writer=writer("d/r1"))
    records.release(BUCKET, directory, run="d/r2", attempt=first)  # not the holder: not recorded
    assert records.read(BUCKET, directory).attempts == ()
    records.release(BUCKET, directory, run="d/r1", job="job-1", attempt=first)
    second = TrainingAttempt("d/r1", "job-1", 10, 50, 1700.0, 4000.0)
    records.claim(BUCKET, directory, run="d/r1", settings=SETTINGS, writer=writer("d/r1"))
    records.release(BUCKET, directory, run="d/r1", job="job-1", attempt=second)
    assert records.read(BUCKET, directory).attempts == (first, second)


def test_a_record_keeps_the_latest_attempts_only(directory: str) -> None:
    records = RunDirRecords()
    for index in range(MAX_ATTEMPTS + 2):
        records.claim(BUCKET, directory, run="d/r1", settings=SETTINGS, writer=writer("d/r1"))
        attempt = TrainingAttempt("d/r1", "job-1", index, index + 1, None, 100.0 + index)
        records.release(BUCKET, directory, run="d/r1", attempt=attempt)
    kept = records.read(BUCKET, directory).attempts
    assert len(kept) == MAX_ATTEMPTS
    assert [a.from_step for a in kept] == list(range(2, MAX_ATTEMPTS + 2))


def test_an_attempt_from_the_training_log() -> None:
    metrics = {"resumed_from_step": 2, "last_step": 5}
    ran = {"started_at": "2026-12-04T10:00:00Z", "ended_at": "2026-12-04T10:05:00Z"}
    attempt = attempt_from_log("d/r1", "rl-job", metrics, ran)
    assert attempt == TrainingAttempt("d/r1", "rl-job", 2, 5, 1796378400.0, 1796378700.0)
    fresh = attempt_from_log("d/r1", "rl-job", {"last_step": None}, None, ended_at=99.0)
    assert fresh == TrainingAttempt("d/r1", "rl-job", 0, None, None, 99.0)
    assert TrainingAttempt.from_dict(attempt.as_dict()) == attempt
    assert TrainingAttempt.from_dict({"run": "d/r1"}) is None  # malformed: dropped, not raised
