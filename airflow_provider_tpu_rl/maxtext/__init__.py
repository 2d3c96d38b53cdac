"""Pure knowledge of what MaxText and Orbax write: RL trainer log lines and checkpoint layouts.

Nothing in this package imports Airflow.
"""
