"""Provider metadata read by Airflow's ProvidersManager (no Airflow import here)."""

from __future__ import annotations

from typing import Any

from airflow_provider_tpu_rl import __version__
from airflow_provider_tpu_rl.hooks.connection_fields import connection_types

INTEGRATION = "Cloud TPU RL (MaxText)"


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-tpu-rl",
        "name": "TPU RL (MaxText GRPO on Cloud TPU)",
        "description": "GRPO RL post-training of LLMs with MaxText on Cloud TPU v6e: GKE + Pathways "
        "via Cluster Toolkit, or a single TPU VM.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://cloud.google.com/tpu/docs",
                "tags": ["gcp"],
            }
        ],
        "hooks": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_provider_tpu_rl.hooks.gcluster",
                    "airflow_provider_tpu_rl.hooks.hf_token",
                    "airflow_provider_tpu_rl.hooks.resource_manager",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_provider_tpu_rl.operators.gke",
                    "airflow_provider_tpu_rl.operators.existing_cluster",
                    "airflow_provider_tpu_rl.operators.ledger",
                    "airflow_provider_tpu_rl.operators.gke_jobs",
                    "airflow_provider_tpu_rl.operators.preflight",
                    "airflow_provider_tpu_rl.operators.tpu_vm",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_provider_tpu_rl.sensors.checkpoint"],
            }
        ],
        "triggers": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "airflow_provider_tpu_rl.triggers.jobset",
                    "airflow_provider_tpu_rl.triggers.gcs_checkpoint",
                ],
            }
        ],
        "extra-links": [
            "airflow_provider_tpu_rl.links.GKEClusterLink",
            "airflow_provider_tpu_rl.links.GKEWorkloadLink",
            "airflow_provider_tpu_rl.links.GCSBrowserLink",
            "airflow_provider_tpu_rl.links.RunDashboardLink",
            "airflow_provider_tpu_rl.links.CloudLoggingJobLink",
        ],
        "connection-types": connection_types(),
        "config": {
            "tpu_rl": {
                "description": "Settings of the TPU RL provider.",
                "options": {
                    "poll_interval": {
                        "description": "Seconds between reads of a job's JobSet by the job operators "
                        "and their trigger (the GCS sensors use their own poke_interval).",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "30",
                        "default": "60",
                    },
                    "retry_delay": {
                        "description": "First retry delay (seconds) of the tasks whose failures can be "
                        "transient; it doubles on each retry, up to 30 minutes. Read when the DAG is parsed.",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "300",
                        "default": "120",
                    },
                    "resource_manager_endpoint": {
                        "description": "Resource Manager API endpoint the preflight task tests the "
                        "caller's IAM permissions against (host:port or http://host:port, for an "
                        "emulator). Empty: the real cloudresourcemanager.googleapis.com.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "http://127.0.0.1:8085",
                        "default": "",
                    },
                    "container_endpoint": {
                        "description": "GKE API endpoint (REST) the job operators ask for a cluster's "
                        "Kubernetes API endpoint and CA (host:port or http://host:port, for an emulator). "
                        "Empty: the real container.googleapis.com.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "http://127.0.0.1:8085",
                        "default": "",
                    },
                    "min_deferral_seconds": {
                        "description": "The least time a job's trigger waits after the task deferred "
                        "before it fires, so a job that ends in seconds does not race the scheduler's "
                        "handling of the deferral (apache/airflow#71580).",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "30",
                        "default": "15",
                    },
                    "trigger_log_settle_seconds": {
                        "description": "How long a job's trigger waits after relaying its last log "
                        "lines before it fires: Airflow 3's triggerer writes a trigger's lines to the "
                        "task log a few KiB per turn of its loop and sends those still unwritten when "
                        "the trigger ends to its own log instead. 0: no wait.",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "5",
                        "default": "2",
                    },
                    "retries": {
                        "description": "Retries of the tasks whose failures can be transient.",
                        "version_added": "0.1.0",
                        "type": "integer",
                        "example": "5",
                        "default": "3",
                    },
                    "janitor_buckets": {
                        "description": "Comma-separated buckets whose resource records "
                        "(tpu-rl/resources/*.json) name the projects the janitor scans, besides the "
                        "buckets named in the run ledger.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "my-tpu-rl-bucket,other-team-bucket",
                        "default": "",
                    },
                    "default_project": {
                        "description": "The GCP project the trigger forms of both pipelines are prefilled with (the project that owns the TPUs, the bucket and the reservation). Empty: the example my-tpu-project, which validate refuses. Read when the DAG files are parsed; a value the "
                        "form would refuse fails their parse, naming the option.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "my-team-project",
                        "default": "",
                    },
                    "default_region": {
                        "description": "The region the GKE pipeline's form is prefilled with (the cluster's and the bucket's). Empty: us-east5. Read when the DAG files are parsed; a value the "
                        "form would refuse fails their parse, naming the option.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "us-east5",
                        "default": "",
                    },
                    "default_zone": {
                        "description": "The zone both forms are prefilled with (the TPUs' and their reservation's; inside default_region). Empty: us-east5-b. Read when the DAG files are parsed; a value the "
                        "form would refuse fails their parse, naming the option.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "us-east5-b",
                        "default": "",
                    },
                    "default_bucket": {
                        "description": "The GCS bucket (name without gs://) both forms are prefilled with. Empty: the example my-tpu-rl-bucket, which validate refuses. Read when the DAG files are parsed; a value the "
                        "form would refuse fails their parse, naming the option.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "my-team-tpu-rl-bucket",
                        "default": "",
                    },
                    "default_gke_reservation": {
                        "description": "The v6e reservation the GKE pipeline's form is prefilled with; set, the form's capacity defaults to reservation. Empty: no reservation (on-demand capacity). Read when the DAG files are parsed; a value the "
                        "form would refuse fails their parse, naming the option.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "my-v6e-32-reservation",
                        "default": "",
                    },
                    "default_tpu_vm_reservation": {
                        "description": "The v6e-8 reservation the TPU VM pipeline's form is prefilled with; set, the form's capacity defaults to reservation. Empty: no reservation (on-demand capacity). Read when the DAG files are parsed; a value the "
                        "form would refuse fails their parse, naming the option.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "my-v6e-8-reservation",
                        "default": "",
                    },
                    "default_authorized_cidr": {
                        "description": "The CIDR the GKE pipeline's form prefills as the control plane's authorized network (on Cloud Composer, the environment's egress range). Empty: 0.0.0.0/0. Read when the DAG files are parsed; a value the "
                        "form would refuse fails their parse, naming the option.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "203.0.113.0/24",
                        "default": "",
                    },
                    "default_service_account": {
                        "description": "The service account e-mail the TPU VM pipeline's form prefills for the VM. Empty: the project's default compute account. Read when the DAG files are parsed; a value the "
                        "form would refuse fails their parse, naming the option.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "tpu-rl-vm@my-team-project.iam.gserviceaccount.com",
                        "default": "",
                    },
                    "default_hf_token_secret": {
                        "description": "The Secret Manager secret holding the Hugging Face token that both forms prefill. Empty: sync the token from the hf_token_conn_id connection. Read when the DAG files are parsed; a value the "
                        "form would refuse fails their parse, naming the option.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "hf-token",
                        "default": "",
                    },
                    "orphan_minutes": {
                        "description": "How long a running DAG run may have no running, queued, "
                        "scheduled, deferred or up-for-retry task (and no change in its task states) "
                        "before the janitor destroys its cluster or TPU VM.",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "60",
                        "default": "30",
                    },
                },
            }
        },
    }
