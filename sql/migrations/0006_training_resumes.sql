-- What restarting a run's training cost: how many times an attempt resumed after an earlier
-- one on the run directory, the steps the earlier attempts trained that no checkpoint kept,
-- and the estimated seconds lost (gaps between attempts plus the lost steps' time).
-- Plain ADD COLUMN (SQLite has no IF NOT EXISTS here): the file runs once, in the
-- same transaction that records its version.
ALTER TABLE runs ADD COLUMN resumes INTEGER;

ALTER TABLE runs ADD COLUMN steps_lost INTEGER;

ALTER TABLE runs ADD COLUMN seconds_lost DOUBLE PRECISION;
