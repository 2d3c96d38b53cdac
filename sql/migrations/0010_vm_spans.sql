-- The CPU VMs a run used besides its TPU (docs/ledger.md, "The boot image's bake"): one row per
-- RUNNING span of each VM, purpose bake (the TPU VM's boot image, baked on a CPU VM). Its billed
-- seconds follow Compute Engine's rule, as the TPU's do: at least a minute, per second after.
-- Seconds and machine type only: no CPU price is stored. The key makes a retried record_run
-- update the row, never add one.
CREATE TABLE IF NOT EXISTS run_vm_spans (
    run_id VARCHAR(512) NOT NULL,
    vm_name VARCHAR(250) NOT NULL,
    started_at TIMESTAMP WITH TIME ZONE NOT NULL,
    purpose VARCHAR(40) NOT NULL,
    vm_zone VARCHAR(100),
    machine_type VARCHAR(100),
    ended_at TIMESTAMP WITH TIME ZONE,
    seconds DOUBLE PRECISION,
    billed_seconds DOUBLE PRECISION,
    recorded_at TIMESTAMP WITH TIME ZONE NOT NULL,
    PRIMARY KEY (run_id, vm_name, started_at)
);
