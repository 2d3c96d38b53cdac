-- BigQuery variant of migrations/0008: billed TPU time from the machines' clocks, its spans, and
-- the capacity held (what an earlier run's chip_hours was).
ALTER TABLE runs
ADD COLUMN IF NOT EXISTS billed_chip_seconds FLOAT64,
ADD COLUMN IF NOT EXISTS billed_spans_json STRING,
ADD COLUMN IF NOT EXISTS held_chip_hours FLOAT64;

UPDATE runs SET
    held_chip_hours = chip_hours,
    chip_hours = NULL,
    estimated_cost_usd = NULL
WHERE
    billed_chip_seconds IS NULL
    AND held_chip_hours IS NULL
    AND chip_hours IS NOT NULL;
