-- BigQuery variant of migrations/0010: one row per RUNNING span of a CPU VM the run used (the
-- bake VM), its billed seconds (at least a minute, per second after).
CREATE TABLE IF NOT EXISTS run_vm_spans (
    run_id STRING NOT NULL,
    vm_name STRING NOT NULL,
    started_at TIMESTAMP NOT NULL,
    purpose STRING NOT NULL,
    vm_zone STRING,
    machine_type STRING,
    ended_at TIMESTAMP,
    seconds FLOAT64,
    billed_seconds FLOAT64,
    recorded_at TIMESTAMP NOT NULL,
    PRIMARY KEY (run_id, vm_name, started_at) NOT ENFORCED
)
CLUSTER BY run_id;
