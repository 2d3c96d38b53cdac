"""Helpers shared by more than one test folder: fakes, the sandbox driver, the end-to-end harness,
the GCS emulator, a PostgreSQL server, the DAG folder's ids, Airflow-version differences.

A fixture itself stays in a ``conftest.py`` (``tests/conftest.py`` for the session-wide ones, a
folder's own for the rest); its body may live here.
"""
