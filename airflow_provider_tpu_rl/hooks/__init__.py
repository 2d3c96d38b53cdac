"""Hooks: run Cluster Toolkit (``gcluster``) and ``gcloud`` commands, fetch the Hugging Face token."""
