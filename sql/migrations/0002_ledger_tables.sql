-- The run ledger. Timestamps are UTC. Keys make every write an upsert:
-- a retried or re-run ledger task updates rows, it never adds duplicates.

-- One row per DAG run: run_id = '<dag_id>/<airflow run_id>'.
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR(512) NOT NULL,
    dag_id VARCHAR(250) NOT NULL,
    airflow_run_id VARCHAR(250) NOT NULL,
    model VARCHAR(200) NOT NULL,
    state VARCHAR(20) NOT NULL,
    started_at TIMESTAMP WITH TIME ZONE,
    ended_at TIMESTAMP WITH TIME ZONE,
    duration_seconds DOUBLE PRECISION,
    chips INTEGER,
    cluster_started_at TIMESTAMP WITH TIME ZONE,
    cluster_ended_at TIMESTAMP WITH TIME ZONE,
    chip_hours DOUBLE PRECISION,
    conf_json TEXT,
    recorded_at TIMESTAMP WITH TIME ZONE NOT NULL,
    PRIMARY KEY (run_id)
);

-- One row per task of a run, holding its latest try.
CREATE TABLE IF NOT EXISTS run_steps (
    run_id VARCHAR(512) NOT NULL,
    task_id VARCHAR(250) NOT NULL,
    state VARCHAR(20),
    try_number INTEGER,
    started_at TIMESTAMP WITH TIME ZONE,
    ended_at TIMESTAMP WITH TIME ZONE,
    duration_seconds DOUBLE PRECISION,
    job_name VARCHAR(63),
    recorded_at TIMESTAMP WITH TIME ZONE NOT NULL,
    PRIMARY KEY (run_id, task_id)
);

-- Rewards, accuracy and loss. phase: pre | intermediate | post | train;
-- step is 0 for pre and post.
CREATE TABLE IF NOT EXISTS run_metrics (
    run_id VARCHAR(512) NOT NULL,
    phase VARCHAR(20) NOT NULL,
    step INTEGER NOT NULL,
    metric_name VARCHAR(100) NOT NULL,
    metric_value DOUBLE PRECISION,
    recorded_at TIMESTAMP WITH TIME ZONE NOT NULL,
    PRIMARY KEY (run_id, phase, step, metric_name)
);

-- Where the run's outputs are. kind: converted_checkpoint | actor_checkpoint | hf_export.
CREATE TABLE IF NOT EXISTS run_artifacts (
    run_id VARCHAR(512) NOT NULL,
    kind VARCHAR(40) NOT NULL,
    uri VARCHAR(1024) NOT NULL,
    step INTEGER,
    recorded_at TIMESTAMP WITH TIME ZONE NOT NULL,
    PRIMARY KEY (run_id, kind, uri)
);
