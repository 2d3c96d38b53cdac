"""Fixtures for the tool runtime's tests: fake gcluster/gcloud executables and a recording logger."""

from tests.support.fake_tools import fake_tools as fake_tools
from tests.support.fake_tools import make_hook as make_hook
from tests.support.fake_tools import recording_logger as recording_logger
