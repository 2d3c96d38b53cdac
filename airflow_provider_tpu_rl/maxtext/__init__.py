"""Pure knowledge of MaxText and Orbax: RL trainer log lines, checkpoint layouts, and the config
keys ``train_rl`` accepts (``config_keys``, generated from MaxText's source by the developer tool
``tools/generate_config_keys.py``, which is not in the wheel).

Nothing in this package imports Airflow.
"""
