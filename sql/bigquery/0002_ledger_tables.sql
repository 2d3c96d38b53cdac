-- BigQuery variant of migrations/0002 and 0003: same tables and columns.
-- Keys are declared NOT ENFORCED: uniqueness comes from the ledger's MERGE
-- statements. Clustering replaces the portable indexes.

CREATE TABLE IF NOT EXISTS runs (
    run_id STRING NOT NULL,
    dag_id STRING NOT NULL,
    airflow_run_id STRING NOT NULL,
    model STRING NOT NULL,
    state STRING NOT NULL,
    started_at TIMESTAMP,
    ended_at TIMESTAMP,
    duration_seconds FLOAT64,
    chips INT64,
    cluster_started_at TIMESTAMP,
    cluster_ended_at TIMESTAMP,
    chip_hours FLOAT64,
    conf_json STRING,
    recorded_at TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id) NOT ENFORCED
)
CLUSTER BY model, run_id;

CREATE TABLE IF NOT EXISTS run_steps (
    run_id STRING NOT NULL,
    task_id STRING NOT NULL,
    state STRING,
    try_number INT64,
    started_at TIMESTAMP,
    ended_at TIMESTAMP,
    duration_seconds FLOAT64,
    job_name STRING,
    recorded_at TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id, task_id) NOT ENFORCED
)
CLUSTER BY run_id;

CREATE TABLE IF NOT EXISTS run_metrics (
    run_id STRING NOT NULL,
    phase STRING NOT NULL,
    step INT64 NOT NULL,
    metric_name STRING NOT NULL,
    metric_value FLOAT64,
    recorded_at TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id, phase, step, metric_name) NOT ENFORCED
)
CLUSTER BY run_id;

CREATE TABLE IF NOT EXISTS run_artifacts (
    run_id STRING NOT NULL,
    kind STRING NOT NULL,
    uri STRING NOT NULL,
    step INT64,
    recorded_at TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id, kind, uri) NOT ENFORCED
)
CLUSTER BY run_id, kind;
