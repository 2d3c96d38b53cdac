-- Indexes for the queries in sql/queries/: newest runs first, per model.
CREATE INDEX IF NOT EXISTS runs_started_at_idx ON runs (started_at);

CREATE INDEX IF NOT EXISTS runs_model_started_at_idx ON runs (model, started_at);

CREATE INDEX IF NOT EXISTS run_artifacts_kind_idx ON run_artifacts (kind);
