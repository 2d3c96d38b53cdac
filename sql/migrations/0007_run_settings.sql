-- What a run was asked to do, as the dashboard's run page lists it: model, capacity, steps,
-- learning rate, run name and the TPU shape, as JSON (validate's resolved values; no secret).
-- Plain ADD COLUMN (SQLite has no IF NOT EXISTS here): the file runs once, in the
-- same transaction that records its version.
ALTER TABLE runs ADD COLUMN settings_json TEXT;
