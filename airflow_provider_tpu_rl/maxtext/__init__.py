"""Pure knowledge of MaxText and Orbax: RL trainer log lines, checkpoint layouts, and the config
keys ``train_rl`` accepts (``config_keys``, generated from MaxText's source by
``generate_config_keys``).

Nothing in this package imports Airflow.
"""
