"""What the provider keeps in the run's bucket, and reads back: who writes a run directory
(``run_dirs``) and whether that job still runs (``writers``), the cluster lease (``lease``), what a
bucket holds of whom (``bucket_usage``), and what the janitor reads (``janitor_sources``)."""
