-- Bookkeeping for the ledger's own migrations: one row per applied file.
-- The runner executes this file before reading the table, so it must stay idempotent.
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER NOT NULL,
    applied_at TIMESTAMP WITH TIME ZONE NOT NULL,
    PRIMARY KEY (version)
);
