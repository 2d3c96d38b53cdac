"""classify_failure: every capacity/transient message the provider knows, and the config default."""

from __future__ import annotations

import pytest

from airflow_provider_tpu_rl.hooks.kubernetes import pod_disruption
from airflow_provider_tpu_rl.toolchain.failures import (
    FailureKind,
    capacity_refused,
    classify_failure,
    classify_workload,
    error_line,
)


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

# apt 2.6.1 with the lock held by another process (tried): `apt-get update`, then `apt-get install`.
APT_LISTS_LOCKED = (
    "Reading package lists...\n"
    "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 812 (apt-get)\n"
    "E: Unable to lock directory /var/lib/apt/lists/"
)
DPKG_LOCKED = (
    "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1033 (unattended-upgr)\n"
    "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?"
)


@pytest.mark.parametrize(
    "output", [TERRAFORM_LOCK_HELD, TERRAFORM_LOCK_REFUSED, KUBECTL_REFUSED, APT_LISTS_LOCKED, DPKG_LOCKED]
)
def test_lock_and_refused_connections_are_transient(output):
    assert classify_failure("gcluster deploy ...\n" + output) is FailureKind.TRANSIENT


# -- a failed workload, in its own words -------------------------------------------------------------
# What MaxText/JAX print as the job dies (the sandbox's simulation prints the same lines).
TRACEBACK = ["I1202 12:00:00 train_rl.py:806] Starting RL training...", "Traceback (most recent call last):"]
OOM = "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 2.50G."
SHAPES = "ValueError: Incompatible shapes for broadcasting: (8, 512) and (4, 640)"
SLICE_LOST = "jax.errors.JaxRuntimeError: UNAVAILABLE: The TPU slice became unhealthy (worker 3 lost)"
DATA_LOSS = "jaxlib.xla_extension.XlaRuntimeError: DATA_LOSS: Slice 0 is down"
HF_503 = "huggingface_hub.errors.HfHubHTTPError: 503 Server Error: Service Unavailable for url: https://hf.co"
NODE_SHUTDOWN = "Pod was terminated in response to imminent node shutdown."


@pytest.mark.parametrize("last", [OOM, SHAPES, "KeyError: 'rl'", "TypeError: unsupported operand"])
def test_a_traceback_of_the_workloads_own_error_is_not_retryable(last):
    kind, line = classify_workload([*TRACEBACK, '  File "train_rl.py", line 9, in main', last])
    assert kind is FailureKind.CONFIG
    assert line == last


@pytest.mark.parametrize("last", [SLICE_LOST, DATA_LOSS, HF_503, NODE_SHUTDOWN])
def test_a_lost_slice_a_preempted_node_or_a_5xx_is_retryable(last):
    kind, line = classify_workload([*TRACEBACK, last])
    assert kind is FailureKind.TRANSIENT
    assert line == last or last == NODE_SHUTDOWN


def test_a_log_that_says_nothing_clear_is_retried():
    assert classify_workload(["step 3/5", "Reshard finished in 1.1s"]) == (FailureKind.TRANSIENT, None)
    assert classify_workload([]) == (FailureKind.TRANSIENT, None)


def test_the_vm_stage_output_of_a_lost_slice_is_transient():
    assert classify_failure("\n".join([*TRACEBACK, SLICE_LOST])) is FailureKind.TRANSIENT
    assert classify_failure("\n".join([*TRACEBACK, OOM])) is FailureKind.CONFIG


def test_the_error_line_is_the_last_line_that_says_what_went_wrong():
    terraform = [
        "module.gke.google_service_account.service_account[0]: Creating...",
        "│ Error: Error creating Cluster: googleapi: Error 409: Already exists, alreadyExists",
        "│ ",
        "│   with module.gke-tpu-v6e-cluster.google_container_cluster.gke_cluster,",
        "│ [",
    ]
    assert (
        error_line(terraform)
        == "Error: Error creating Cluster: googleapi: Error 409: Already exists, alreadyExists"
    )
    assert error_line(["ERROR: (gcloud.secrets.create) NOT_FOUND: Project x not found", "done"]) == (
        "ERROR: (gcloud.secrets.create) NOT_FOUND: Project x not found"
    )
    assert error_line(["E: Could not get lock /var/lib/dpkg/lock-frontend"]) == (
        "E: Could not get lock /var/lib/dpkg/lock-frontend"
    )
    assert error_line(["all good", "still good"]) is None


def test_a_pod_lost_to_its_node_is_a_disruption():
    preempted = {
        "metadata": {"name": "job-worker-0"},
        "status": {
            "conditions": [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "TerminationByKubelet",
                    "message": NODE_SHUTDOWN,
                }
            ]
        },
    }
    shut_down = {
        "metadata": {"name": "job-worker-1"},
        "status": {"reason": "Terminated", "message": NODE_SHUTDOWN},
    }
    healthy = {"metadata": {"name": "job-worker-2"}, "status": {"phase": "Failed", "conditions": []}}
    assert pod_disruption([healthy, preempted]) == f"pod job-worker-0: TerminationByKubelet: {NODE_SHUTDOWN}"
    assert pod_disruption([shut_down]) == f"pod job-worker-1: Terminated: {NODE_SHUTDOWN}"
    assert pod_disruption([healthy]) is None


# What gcloud 528 prints when an operation fails for capacity or quota: "---" on the ERROR line, then
# the operation's errors as YAML (api_lib/compute/operations/poller.py OperationErrors and
# utils.ConstructList, printed here by gcloud 528's own classes for one ZONE_RESOURCE_POOL_EXHAUSTED
# error: the top-level message wraps onto a line indented by two).
GCLOUD_STOCKOUT = [
    "Starting instance(s) tpu-vm...",
    "....failed.",
    "ERROR: (gcloud.compute.instances.start) ---",
    "code: ZONE_RESOURCE_POOL_EXHAUSTED",
    "errorDetails:",
    "- localizedMessage:",
    "    locale: en-US",
    "    message: nested",
    "message: The zone 'projects/p/zones/z' does not have enough resources available to",
    "  fulfill the request.  Try a different zone, or try again later.",
]


def test_gclouds_reason_stays_with_its_error_line():
    """The one line a watcher or a user reads keeps why gcloud failed, not only that it did."""
    assert error_line(GCLOUD_STOCKOUT) == (
        "ERROR: (gcloud.compute.instances.start) --- code: ZONE_RESOURCE_POOL_EXHAUSTED message: The zone "
        "'projects/p/zones/z' does not have enough resources available to fulfill the request.  Try a "
        "different zone, or try again later."
    )
    # "Could not fetch resource:" (client_adapter.MakeRequests): the first " - " reason is kept
    fetched = [
        "ERROR: (gcloud.compute.instances.describe) Could not fetch resource:",
        " - The resource 'projects/p/zones/z/instances/vm' was not found",
        " - a second reason",
        "",
    ]
    assert error_line(fetched) == (
        "ERROR: (gcloud.compute.instances.describe) Could not fetch resource: "
        "- The resource 'projects/p/zones/z/instances/vm' was not found"
    )
    # an ERROR line that says it all is left as it is
    one = ["ERROR: (gcloud.compute.instances.start) HTTPError 400: Invalid value for field 'resource'", "x"]
    assert error_line(one) == one[0]


@pytest.mark.parametrize(
    ("output", "refused"),
    [
        # Compute Engine's refusals through gcloud (the sandbox's world/capacity.py texts)
        (
            "ERROR: (gcloud.compute.instances.create) Could not fetch resource:\n - The zone "
            "'projects/p/zones/us-east5-b' does not have enough resources available to fulfill the request.",
            True,
        ),
        (
            "ERROR: (gcloud.compute.instances.create) Could not fetch resource:\n - Quota 'PREEMPTIBLE_TPU_V6E' exceeded.  Limit: 0.0 in region us-east5.",
            True,
        ),
        (
            "ERROR: (gcloud.compute.instances.create) Could not fetch resource:\n - Specified reservation "
            "'res-8' does not have available resources for the request.",
            True,
        ),
        # not a lack of capacity: the create's own errors, a missing reservation, a 503
        (
            "ERROR: (gcloud.compute.instances.create) Could not fetch resource:\n - Specified reservation 'r' does not exist.",
            False,
        ),
        (
            "ERROR: (gcloud.alpha.compute.instances.create) You do not currently have this command group installed.",
            False,
        ),
        ("googleapi: Error 503: Service Unavailable", False),
    ],
)
def test_a_capacity_refusal_is_a_stockout_a_quota_or_a_full_reservation(output: str, refused: bool) -> None:
    assert capacity_refused(output) is refused
    # a full reservation is not retried as capacity when it is the only kind (as before)
    if "Specified reservation" in output:
        assert classify_failure(output) is FailureKind.CONFIG
