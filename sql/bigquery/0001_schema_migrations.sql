-- BigQuery variant of migrations/0001. Tables are created in the connection's
-- default dataset (the ledger sets it on every query job).
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INT64 NOT NULL,
    applied_at TIMESTAMP NOT NULL,
    PRIMARY KEY (version) NOT ENFORCED
);
