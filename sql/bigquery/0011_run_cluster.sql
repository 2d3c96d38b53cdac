-- BigQuery variant of migrations/0012: the GKE cluster a run ran on and where it came from.
ALTER TABLE runs
ADD COLUMN IF NOT EXISTS gke_cluster STRING,
ADD COLUMN IF NOT EXISTS gke_cluster_origin STRING;
