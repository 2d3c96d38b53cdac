"""Fixtures for the operator tests: the session sandbox, entered for one test with its own names."""

from tests.support.sandbox_run import clean_faults as clean_faults
from tests.support.sandbox_run import preempt_after_two as preempt_after_two
from tests.support.sandbox_run import sb as sb
from tests.support.sandbox_run import spot_tpu_restarts as spot_tpu_restarts
