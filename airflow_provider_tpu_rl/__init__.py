"""Apache Airflow provider for GRPO RL post-training with MaxText on Cloud TPU v6e."""

__version__ = "0.1.0"
