-- The promotion gate's decision in one line ("promoted: ...", "not promoted: reward gain ... <
-- min_reward_gain ..."): written by promote_model, shown by `tpu-rl runs` and the dashboard; NULL
-- when the gate never ran (a failed or refused run).
-- Plain ADD COLUMN (SQLite has no IF NOT EXISTS here): the file runs once, in the
-- same transaction that records its version.
ALTER TABLE runs ADD COLUMN promotion TEXT;
