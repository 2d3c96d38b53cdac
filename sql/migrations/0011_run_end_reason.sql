-- Why a run's row was closed by someone other than its own record_run, in one line: the janitor's
-- "janitor: ..." when it ended the resources of a run nobody finished (state abandoned) or found
-- its DAG run failed while the row still said running (state failed). NULL for a run that
-- recorded itself. Shown by `tpu-rl runs` and the dashboard.
-- Plain ADD COLUMN (SQLite has no IF NOT EXISTS here): the file runs once, in the
-- same transaction that records its version.
ALTER TABLE runs ADD COLUMN end_reason TEXT;
