"""Specs → argv lists. The single renderer of every command; nothing here imports Airflow."""

from airflow_provider_tpu_rl.render.command import SECRET_PLACEHOLDER, Command

__all__ = ["SECRET_PLACEHOLDER", "Command"]
