-- Run once by the postgres image on an empty data volume (docker/compose.yaml): the run ledger's
-- own database next to Airflow's metadata database (AIRFLOW_CONN_TPU_RL_LEDGER points at it).
CREATE DATABASE tpu_rl_ledger OWNER airflow;
