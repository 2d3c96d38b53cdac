"""Airflow operators: a thin shell over the specs and the renderer."""
