"""A cancelled JobSet trigger stops: no await of it swallows the cancellation.

Before Airflow 3.3 only a kill cancels a training job, through the trigger's cancellation: a
cancellation lost inside the trigger leaves the JobSet training until the teardown. Python 3.11's
``asyncio.wait_for`` loses one when its awaitable finishes in the same loop turn as the
cancellation (it returns the result: CPython gh-86296, fixed in 3.12 by rewriting it on
``asyncio.timeout``); and reaping a cancelled child task under ``suppress(CancelledError)`` loses a
cancellation of the reaping task itself. Both are played here deterministically, with no sandbox:
the cancellation is scheduled from inside the awaited work, so it lands in that very loop turn.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_provider_tpu_rl.triggers.jobset import JobSetTrigger

CURSOR = "gs://bucket/tpu-rl/log-cursors/job-1/cursor.json"


def _trigger() -> JobSetTrigger:
    return JobSetTrigger(
        job_name="job-1",
        cluster_url="https://127.0.0.1:1",
        ssl_ca_cert="ca",
        cursor_uri=CURSOR,
        poll_interval=5,
    )


class _UploadThatEndsAsTheTriggerIsCancelled:
    """A GCS client whose upload finishes in the same loop turn as the trigger's cancellation."""

    def __init__(self, victim: asyncio.Task[Any]) -> None:
        self.victim = victim
        self.uploads = 0

    async def upload(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.uploads += 1
        asyncio.get_running_loop().call_soon(self.victim.cancel)
        return {}


async def ends_cancelled(task: asyncio.Task[Any]) -> None:
    """``task`` ends by its cancellation (not 10 s later, still watching: a swallowed one)."""
    try:
        await asyncio.wait_for(task, timeout=10)
    except asyncio.CancelledError:
        return
    except TimeoutError:
        pytest.fail("the cancellation was swallowed: the trigger went on watching")
    pytest.fail("the task ended without its cancellation")


async def test_a_cancellation_as_the_cursor_upload_ends_stops_the_trigger() -> None:
    trigger = _trigger()
    trigger._version = 1  # something to save

    async def save_then_go_on() -> None:
        await trigger._save_cursor(force=True)
        await asyncio.sleep(30)  # the watch that would follow: a swallowed cancel sleeps here

    task = asyncio.get_running_loop().create_task(save_then_go_on())
    storage = _UploadThatEndsAsTheTriggerIsCancelled(task)

    async def storage_client() -> Any:
        return storage

    trigger._storage_client = storage_client  # type: ignore[method-assign]
    await ends_cancelled(task)
    assert storage.uploads == 1


async def test_a_cancellation_while_the_log_follower_is_reaped_stops_the_trigger() -> None:
    trigger = _trigger()

    async def follower() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            # the follower's own cleanup takes a turn, during which its reaper is cancelled
            asyncio.get_running_loop().call_soon(reaper.cancel)
            await asyncio.sleep(0)
            raise

    trigger._follower = asyncio.get_running_loop().create_task(follower())
    await asyncio.sleep(0)  # the follower is running
    outcome: dict[str, Any] = {}

    async def stop_then_go_on() -> None:
        await trigger._stop_follower()
        outcome["went on after the cancellation"] = True
        await asyncio.sleep(30)

    reaper = asyncio.get_running_loop().create_task(stop_then_go_on())
    await ends_cancelled(reaper)
    assert outcome == {}, "the follower's reaper went on after its own cancellation"
    assert trigger._follower.cancelled()


async def test_a_cancellation_while_the_state_loop_pauses_stops_the_trigger() -> None:
    trigger = _trigger()
    task = asyncio.get_running_loop().create_task(trigger._pause())
    await asyncio.sleep(0)
    task.cancel()
    await ends_cancelled(task)
