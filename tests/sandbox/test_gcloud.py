"""Fake gcloud: buckets, secrets (never stored in clear), IAM, instances, clusters, the call log."""

from __future__ import annotations

import hashlib
import json

from tests.sandbox.conftest import Cli, Cluster, deploy_args
from tpu_rl_sandbox.world import iam, inventory, secret_values
from tpu_rl_sandbox.world.calls import read_calls
from tpu_rl_sandbox.world.settings import reset_settings, update_settings
from tpu_rl_sandbox.world.store import StateStore

ACCESSOR = "roles/secretmanager.secretAccessor"


def test_bucket_create_is_not_idempotent_and_describe_reports_it(cli: Cli, names: dict[str, str]) -> None:
    url = f"gs://{names['bucket']}"
    created = cli.gcloud(
        "storage", "buckets", "create", url, f"--project={names['project']}", "--location=us-east5"
    )
    assert (created.code, created.err) == (0, f"Creating {url}/...\n")
    again = cli.gcloud(
        "storage", "buckets", "create", url, f"--project={names['project']}", "--location=us-east5"
    )
    assert again.code == 1
    assert again.err == (
        f"Creating {url}/...\nERROR: (gcloud.storage.buckets.create) HTTPError 409: Your previous request to create "
        "the named bucket succeeded and you already own it.\n"
    )
    described = cli.gcloud("storage", "buckets", "describe", url, "--format=json")
    assert json.loads(described.out)["location"] == "US-EAST5"
    missing = cli.gcloud("storage", "buckets", "describe", "gs://no-such-bucket-zz")
    assert missing.code == 1
    assert "gs://no-such-bucket-zz not found: 404." in missing.err


def test_bucket_create_on_a_name_another_project_holds_says_it_is_not_available(
    cli: Cli, names: dict[str, str]
) -> None:
    url = f"gs://{names['bucket']}"
    assert cli.gcloud("storage", "buckets", "create", url, f"--project=other-{names['project']}").code == 0
    taken = cli.gcloud("storage", "buckets", "create", url, f"--project={names['project']}")
    assert taken.code == 1
    assert taken.err == (
        f"Creating {url}/...\nERROR: (gcloud.storage.buckets.create) HTTPError 409: The requested bucket "
        "name is not available. The bucket namespace is shared by all users of the system. Please select "
        "a different name and try again.\n"
    )


def test_storage_ls_and_rm(cli: Cli, names: dict[str, str]) -> None:
    bucket = names["bucket"]
    assert (
        cli.gcloud("storage", "buckets", "create", f"gs://{bucket}", f"--project={names['project']}").code
        == 0
    )
    for name in ("m/a/1.txt", "m/a/2.txt", "m/top.txt"):
        cli.api.upload(bucket, name, b"x")
    listed = cli.gcloud("storage", "ls", f"gs://{bucket}/m/")
    assert listed.out.splitlines() == [f"gs://{bucket}/m/top.txt", f"gs://{bucket}/m/a/"]
    long = cli.gcloud("storage", "ls", "-l", f"gs://{bucket}/m/a/")
    assert long.out.splitlines()[-1] == "TOTAL: 2 objects, 2 bytes (2B)"
    nothing = cli.gcloud("storage", "ls", f"gs://{bucket}/nope/")
    assert (nothing.code, nothing.err) == (
        1,
        "ERROR: (gcloud.storage.ls) One or more URLs matched no objects.\n",
    )
    assert cli.gcloud("storage", "rm", "-r", f"gs://{bucket}/m/a").code == 0
    assert cli.objects(bucket) == ["m/top.txt"]
    assert cli.gcloud("storage", "rm", "-r", f"gs://{bucket}").code == 0
    assert cli.api.get_bucket(bucket) is None


def test_secret_lifecycle_stores_only_a_hash(cli: Cli, names: dict[str, str]) -> None:
    project = names["project"]
    clear = b"hf_do_not_store_me_4242"
    created = cli.gcloud("secrets", "create", "hf", f"--project={project}", "--replication-policy=automatic")
    assert (created.code, created.err) == (0, "Created secret [hf].\n")
    duplicate = cli.gcloud(
        "secrets", "create", "hf", f"--project={project}", "--replication-policy=automatic"
    )
    assert duplicate.code == 1
    assert "already exists" in duplicate.err
    added = cli.gcloud(
        "secrets", "versions", "add", "hf", f"--project={project}", "--data-file=-", stdin=clear
    )
    assert (added.code, added.err) == (0, "Created version [1] of the secret [hf].\n")
    version = cli.state("secrets")[f"{project}/hf"]["versions"][0]
    assert version["sha256"] == hashlib.sha256(clear).hexdigest()
    assert version["length"] == len(clear)
    for path in cli.info.root.rglob("*"):
        if path.is_file():
            assert clear not in path.read_bytes(), path
    described = cli.gcloud("secrets", "describe", "hf", f"--project={project}", "--format=json")
    assert json.loads(described.out)["replication"] == {"automatic": {}}
    no_secret = cli.gcloud(
        "secrets", "versions", "add", "nope", f"--project={project}", "--data-file=-", stdin=b"x"
    )
    assert no_secret.code == 1
    assert "NOT_FOUND" in no_secret.err
    unset_project = cli.gcloud("secrets", "describe", "hf")
    assert unset_project.code == 1
    assert "The required property [project] is not currently set." in unset_project.err


def test_iam_bindings_need_existing_service_accounts(cli: Cli, cluster: Cluster) -> None:
    member = f"serviceAccount:{cluster.name}-gke-wl-sa@{cluster.project}.iam.gserviceaccount.com"
    bound = cli.gcloud(
        "projects",
        "add-iam-policy-binding",
        cluster.project,
        f"--member={member}",
        "--role=roles/storage.admin",
        "--quiet",
        "--condition=None",  # the sandbox project's policy holds a conditional binding
        "--format=json",
    )
    assert bound.code == 0
    policy = json.loads(bound.out)
    assert member in next(b["members"] for b in policy["bindings"] if b["role"] == "roles/storage.admin")
    ghost = cli.gcloud(
        "projects",
        "add-iam-policy-binding",
        cluster.project,
        f"--member=serviceAccount:ghost-gke-wl-sa@{cluster.project}.iam.gserviceaccount.com",
        "--role=roles/storage.admin",
        "--condition=None",
    )
    assert ghost.code == 1
    assert "does not exist" in ghost.err
    bad_role = cli.gcloud(
        "projects",
        "add-iam-policy-binding",
        cluster.project,
        f"--member={member}",
        "--role=storage.admin",
        "--condition=None",
    )
    assert bad_role.code == 1
    secret_binding = cli.gcloud(
        "secrets",
        "add-iam-policy-binding",
        cluster.secret,
        f"--project={cluster.project}",
        f"--member={member}",
        "--role=roles/secretmanager.secretAccessor",
    )
    assert secret_binding.code == 0, secret_binding.text
    missing_flag = cli.gcloud(
        "secrets", "add-iam-policy-binding", cluster.secret, f"--project={cluster.project}", "--role=roles/x"
    )
    assert missing_flag.code == 2
    assert "argument --member: Must be specified." in missing_flag.err


def test_a_new_secret_grant_is_refused_until_it_has_propagated(cli: Cli, names: dict[str, str]) -> None:
    """IAM is eventually consistent: the policy shows a new binding at once, the member's reads are
    refused with Secret Manager's 403 until ``iam_propagation_seconds`` have passed."""
    project = names["project"]
    store = StateStore(cli.layout)
    reader = (
        f"principal://iam.googleapis.com/projects/{inventory.project_number(project)}/locations/global/"
        f"workloadIdentityPools/{project}.svc.id.goog/subject/ns/default/sa/reader"
    )
    binding = ("hf", f"--project={project}", f"--member={reader}", f"--role={ACCESSOR}")
    denied = (
        None,
        f"PERMISSION_DENIED: Permission 'secretmanager.versions.access' denied for resource "
        f"'projects/{project}/secrets/hf/versions/latest' (or it may not exist).",
    )

    def read() -> tuple[str | None, str]:
        return secret_values.pod_secret_value(store, reader, project, "hf", "latest")

    def propagate() -> None:
        """As if the propagation delay had passed since the grant."""
        with store.txn() as txn:
            secrets = txn.doc("secrets")
            secrets[f"{project}/hf"][iam.GRANTED_AT][ACCESSOR][reader] -= 61.0
            txn.save("secrets")

    update_settings(cli.layout, iam_propagation_seconds=60.0)
    try:
        created = cli.gcloud("secrets", "create", "hf", f"--project={project}", "--data-file=-", stdin=b"v")
        assert created.code == 0, created.text
        assert read() == denied  # no grant
        assert cli.gcloud("secrets", "add-iam-policy-binding", *binding).code == 0
        assert reader in iam.iam_bindings(cli.layout, f"projects/{project}/secrets/hf")[ACCESSOR]
        assert read() == denied  # granted, not in effect yet
        propagate()
        value, problem = read()
        assert (problem, str(value).startswith("hf_sandbox_")) == ("", True)
        # the same grant again changes no policy: nothing to propagate
        assert cli.gcloud("secrets", "add-iam-policy-binding", *binding).code == 0
        assert read()[0] == value
        # taken back and granted anew: a new grant, not in effect yet
        assert cli.gcloud("secrets", "remove-iam-policy-binding", *binding).code == 0
        assert read() == denied
        assert cli.gcloud("secrets", "add-iam-policy-binding", *binding).code == 0
        assert read() == denied
        # no delay: a grant is in effect at once
        update_settings(cli.layout, iam_propagation_seconds=0.0)
        assert read()[0] == value
    finally:
        reset_settings(cli.layout)


def test_cluster_list_filters_on_blueprint_labels(cli: Cli, names: dict[str, str]) -> None:
    assert (
        cli.gcluster(
            "deploy",
            str(cli.info.blueprint),
            *deploy_args(names, backend=False, extra_vars="labels={owner: tpu-rl}"),
        ).code
        == 0
    )
    hit = cli.gcloud(
        "container",
        "clusters",
        "list",
        f"--project={names['project']}",
        "--filter=resourceLabels.owner=tpu-rl",
        "--format=json",
    )
    assert [c["name"] for c in json.loads(hit.out)] == [names["cluster"]]
    miss = cli.gcloud(
        "container",
        "clusters",
        "list",
        f"--project={names['project']}",
        "--filter=resourceLabels.owner=other",
        "--format=json",
    )
    assert json.loads(miss.out) == []
    described = cli.gcloud(
        "container",
        "clusters",
        "describe",
        names["cluster"],
        f"--location={names['region']}",
        f"--project={names['project']}",
        "--format=json",
    )
    assert "cpu-np" in [p["name"] for p in json.loads(described.out)["nodePools"]]
    wrong_location = cli.gcloud(
        "container",
        "clusters",
        "describe",
        names["cluster"],
        f"--location={names['zone']}",
        f"--project={names['project']}",
    )
    assert wrong_location.code == 1
    assert "code=404" in wrong_location.err


def test_calls_are_logged_with_env_names_only(cli: Cli, names: dict[str, str]) -> None:
    secret_value = "hf_value_that_must_not_be_logged"
    result = cli.shim(
        "gcloud",
        "secrets",
        "create",
        "logged",
        f"--project={names['project']}",
        "--data-file=-",
        stdin=b"stdin_payload_never_logged",
        env={"HF_TOKEN": secret_value},
    )
    assert result.code == 0, result.text
    unknown = cli.shim("gcluster", "job", "list", "--bogus")
    assert (unknown.code, unknown.err) == (1, "Error: unknown flag: --bogus\n")
    calls = read_calls(cli.layout)
    mine = [
        c
        for c in calls
        if c["argv"][:3] == ["secrets", "create", "logged"] and f"--project={names['project']}" in c["argv"]
    ]
    assert len(mine) == 1
    entry = mine[0]
    assert entry["tool"] == "gcloud"
    assert entry["exit_code"] == 0
    assert entry["cwd"] == str(cli.cwd)
    assert entry["start"] <= entry["end"]
    assert "HF_TOKEN" in entry["env_names"]
    assert entry["env_names"] == sorted(entry["env_names"])
    raw = cli.layout.calls_file.read_text()
    assert secret_value not in raw
    assert "stdin_payload_never_logged" not in raw
    assert any(
        c["tool"] == "gcluster" and c["argv"] == ["job", "list", "--bogus"] and c["exit_code"] == 1
        for c in calls
    )
