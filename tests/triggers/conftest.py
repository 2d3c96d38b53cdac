"""Fixtures for the trigger tests: the session sandbox, entered for one test with its own names."""

from tests.support.sandbox_run import sb as sb
