"""The suite's bounded waits on a process: its output kept when the bound kills it."""

from __future__ import annotations

import sys

import pytest

from tests.support.waiting import WaitTimedOut, run_bounded

PRINTS_THEN_HANGS = "import time; print('reached the second step', flush=True); time.sleep(60)"


def test_a_process_that_ends_in_time_is_returned_with_its_output() -> None:
    done = run_bounded([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], "a short process", 60)
    assert (done.returncode, done.stdout) == (3, "out\n")


def test_a_hung_process_is_killed_and_named_with_what_it_printed() -> None:
    with pytest.raises(WaitTimedOut) as timed_out:
        run_bounded([sys.executable, "-c", PRINTS_THEN_HANGS], "the hanging step", 2)
    first, *rest = str(timed_out.value).splitlines()
    assert first == "timed out after 2 s waiting for the hanging step"
    assert "reached the second step" in rest
