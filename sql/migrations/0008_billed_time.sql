-- Billed TPU time from the machines' own clocks (docs/ledger.md, "What the TPU bills"): the
-- chip-seconds (each RUNNING span of each TPU machine, at least a minute, x its chips) and the
-- spans, as JSON. The span of the tasks that create and delete the capacity is no longer called
-- billed: it is the capacity the run held (held_chip_hours). Plain ADD COLUMN (SQLite has no IF
-- NOT EXISTS here): the file runs once, in the same transaction that records its version.
ALTER TABLE runs ADD COLUMN billed_chip_seconds DOUBLE PRECISION;

ALTER TABLE runs ADD COLUMN billed_spans_json TEXT;

ALTER TABLE runs ADD COLUMN held_chip_hours DOUBLE PRECISION;

-- A run recorded before: its chip_hours was the held span. It moves to held_chip_hours; its billed
-- time, and the cost estimated from it, become unknown. Guarded: a second run changes nothing.
UPDATE runs SET
    held_chip_hours = chip_hours,
    chip_hours = NULL,
    estimated_cost_usd = NULL
WHERE
    billed_chip_seconds IS NULL
    AND held_chip_hours IS NULL
    AND chip_hours IS NOT NULL;
