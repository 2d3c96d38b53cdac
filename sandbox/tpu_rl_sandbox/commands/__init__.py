"""The ``tpu-rl-sandbox`` subcommands: ``up``/``down``/``env``, ``demo`` and ``bench``."""
