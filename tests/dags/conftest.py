"""The ``pipeline`` fixture: each pipeline DAG of the parsed folder with its shape."""

from tests.support.pipeline_shapes import pipeline as pipeline
