-- Why a run was refused before anything was spent, in one line ("refused at validate: ..."):
-- `tpu-rl runs` prints it in place of the columns such a run has no values for.
-- Plain ADD COLUMN (SQLite has no IF NOT EXISTS here): the file runs once, in the
-- same transaction that records its version.
ALTER TABLE runs ADD COLUMN refusal TEXT;
