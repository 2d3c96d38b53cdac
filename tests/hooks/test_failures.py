"""classify_failure: every capacity/transient message the provider knows, and the config default."""

from __future__ import annotations

import pytest

from airflow_provider_tpu_rl.hooks.failures import FailureKind, classify_failure


@pytest.mark.parametrize(
    "output",
    [
        "Error: Error waiting for creating GKE NodePool: GCE_STOCKOUT: The zone does not have capacity",
        "code = ZONE_RESOURCE_POOL_EXHAUSTED desc = The zone 'projects/p/zones/us-east5-b' ...",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: not enough resources",
        "Error 400: INSUFFICIENT_CAPACITY for ct6e-standard-4t",
        "The zone 'projects/p/zones/us-east5-b' does not have enough resources available to fulfill the request.",
        "Error: Quota 'TPUS_V6E_PER_PROJECT_PER_ZONE' exceeded.  Limit: 32.0 in zone us-east5-b.",
        "Error 403: Quota exceeded for quota metric 'CPUS' and limit 'CPUS-per-project-region'",
        "googleapi: Error 403: QUOTA_EXCEEDED",
    ],
)
def test_capacity(output):
    assert classify_failure("Planning...\n" + output + "\ndone") is FailureKind.CAPACITY


@pytest.mark.parametrize(
    "output",
    [
        "googleapi: Error 429: Too Many Requests, rateLimitExceeded",
        "googleapi: Error 500: Internal error encountered., backendError",
        "HTTP/1.1 502 Bad Gateway",
        "Error 503: The service is currently unavailable.",
        "status code: 504",
        "504 Gateway Timeout",
        "Error: rateLimitExceeded",
        "error: read tcp 10.0.0.2:4411->34.1.2.3:443: read: connection reset by peer",
        "dial tcp 34.1.2.3:443: i/o timeout",
        "net/http: TLS handshake timeout",
        "Get https://34.1.2.3/apis: context deadline exceeded",
        "Error from server: etcdserver: request timed out",
        "the server is currently unable to handle the request (get jobsets.jobset.x-k8s.io)",
        "dial tcp 10.1.2.3:443: connect: connection refused",
        "ssh: connect to host 34.1.2.3 port 22: Connection timed out",
        "ERROR: (gcloud.compute.instances.delete) Could not fetch resource:\n"
        " - The resource 'projects/p/zones/us-east5-b/instances/vm' is not ready",
        "Error: Error waiting for Deleting Network: The network resource 'projects/p/global/networks/c-net-0' "
        "is already being used by 'projects/p/global/firewalls/c-internal-0'",
    ],
)
def test_transient(output):
    assert classify_failure(output) is FailureKind.TRANSIENT


@pytest.mark.parametrize(
    "output",
    [
        "Error: unknown flag: --bogus",
        "Error: job with name 'rl' already exists",
        "Error: cluster name is required; please specify it using the --cluster flag",
        "Error: EOF",
        "boot disk size 500GB is larger than image size",  # a 5xx number, but not a status
        "listening on port 502 failed validation",
        "",
    ],
)
def test_everything_else_is_a_config_error(output):
    assert classify_failure(output) is FailureKind.CONFIG


def test_capacity_wins_over_a_surrounding_5xx():
    assert classify_failure("Error 503: GCE_STOCKOUT") is FailureKind.CAPACITY


def test_only_config_is_not_retryable():
    assert [k for k in FailureKind if not k.retryable] == [FailureKind.CONFIG]


# Real output, captured from Terraform v1.11.4 (the version the toolchain installs) and kubectl:
# a local state locked by a running `terraform apply`, then `terraform plan -lock-timeout=1s`.
TERRAFORM_LOCK_HELD = """\
Acquiring state lock. This may take a few moments...
╷
│ Error: Error acquiring the state lock
│
│ Error message: resource temporarily unavailable
│ Lock Info:
│   ID:        64f60bee-4f4a-10dd-1a1a-6b81129b9bf1
│   Path:      terraform.tfstate
│   Operation: OperationTypeApply
│   Who:       root@vm
│   Version:   1.11.4
│   Created:   2026-12-01 16:36:09.287707208 +0000 UTC
│   Info:
│
│
│ Terraform acquires a state lock to protect the state from being written
│ by multiple users at the same time. Please resolve the issue above and try
│ again. For most commands, you can disable locking with the "-lock=false"
│ flag, but this is not recommended.
╵
"""
# An http backend whose lock server is down: Terraform wraps the line inside "connect: ... refused".
TERRAFORM_LOCK_REFUSED = """\
╷
│ Error: Error acquiring the state lock
│
│ Error message: Failed to lock: LOCK http://127.0.0.1:1/lock giving up after 3
│ attempt(s): Lock "http://127.0.0.1:1/lock": dial tcp 127.0.0.1:1: connect:
│ connection refused
╵
"""
KUBECTL_REFUSED = (
    "The connection to the server 127.0.0.1:1 was refused - did you specify the right host or port?"
)


@pytest.mark.parametrize("output", [TERRAFORM_LOCK_HELD, TERRAFORM_LOCK_REFUSED, KUBECTL_REFUSED])
def test_lock_and_refused_connections_are_transient(output):
    assert classify_failure("gcluster deploy ...\n" + output) is FailureKind.TRANSIENT
