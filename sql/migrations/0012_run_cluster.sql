-- The GKE cluster a run ran on, PROJECT/LOCATION/NAME as the provider knows it (the cluster it
-- deployed in cluster_mode create, the one it named in cluster_mode existing), and where that
-- cluster came from: created (by this run), kept (a create-mode cluster an earlier run handed over
-- with keep_cluster, taken over through its lease) or existing (a cluster the run neither deploys
-- nor destroys). NULL on a TPU VM run. Shown by `tpu-rl runs`, the dashboard and the model card.
-- Plain ADD COLUMN (SQLite has no IF NOT EXISTS here): the file runs once, in the
-- same transaction that records its version.
ALTER TABLE runs ADD COLUMN gke_cluster TEXT;

ALTER TABLE runs ADD COLUMN gke_cluster_origin VARCHAR(20);
