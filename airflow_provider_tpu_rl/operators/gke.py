"""Cluster lifecycle operators: bucket, HF token secret, deploy, destroy."""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import Context

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import CommandError, ConfigurationError, FailureKind, LeaseHeldError
from airflow_provider_tpu_rl.ledger.collect import CAPACITY_XCOM_KEY
from airflow_provider_tpu_rl.ledger.records import CLUSTER_CREATED, CLUSTER_KEPT
from airflow_provider_tpu_rl.links import GKEClusterLink
from airflow_provider_tpu_rl.operators import billing
from airflow_provider_tpu_rl.operators.base import GclusterBaseOperator, expiry_of_run, fail_fast
from airflow_provider_tpu_rl.records.grants import RunGrants, carried_grants, recorded_grants
from airflow_provider_tpu_rl.records.lease import ClusterLeaseHook, Lease, held_message, utc_text
from airflow_provider_tpu_rl.records.resources import read_resource_record, write_resource_record
from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.render.blueprint import BLUEPRINT_RELPATH, TPU_GROUP, customize_blueprint
from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.cluster import FLEX_START, ClusterSpec, default_capacity
from airflow_provider_tpu_rl.spec.pipeline import (
    cluster_from_arguments,
    hf_token_spec,
    image_repository,
    run_suffix,
)
from airflow_provider_tpu_rl.spec.preflight import enabled_secret_versions, parse_json_document
from airflow_provider_tpu_rl.toolchain.failures import capacity_refused

if TYPE_CHECKING:
    from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook


class EnsureBucketOperator(GclusterBaseOperator):
    """Create a GCS bucket; one that exists in the project already (and everything in it) is kept
    as is, once a marker object written and deleted there shows the GCP connection can write to it.
    A name another project holds, or a bucket of ours the connection cannot write to, fails the
    task in one line: the run could not write there.

    :param project_id: project that owns the bucket; empty: the GCP connection's.
    :param location: bucket location (the region of the TPUs).
    :param bucket: bucket name, without ``gs://``.
    """

    template_fields: Sequence[str] = (
        "project_id",
        "location",
        "bucket",
        "gcluster_conn_id",
        "gcp_conn_id",
        "impersonation_chain",
    )

    def __init__(self, *, location: str, bucket: str, project_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.project_id = project_id
        self.location = location
        self.bucket = bucket

    @fail_fast
    def execute(self, context: Context) -> str:
        project = rules.project_id("project_id", self.resolve_project_id())
        location = rules.region("location", self.location)
        bucket = rules.bucket_name("bucket", self.bucket)
        command = gke.create_bucket(project, location, bucket)
        result = self.hook.run(command)
        if not result.ok and not result.timed_out and bucket_name_taken(result.output):
            raise ConfigurationError(
                f"gs://{bucket}: the bucket name is taken by another project (bucket names are global, "
                f"and Cloud Storage says it is not {project}'s): set bucket to a name of your own"
            )
        self.hook.check_result(command, result)
        from airflow_provider_tpu_rl.records.bucket_usage import BucketUsage

        usage = BucketUsage(self.gcp_conn_id, self.chain)
        if result.ok_marker:
            # Ours, but "you own it" says nothing of this connection's object permissions.
            usage.check_writable(bucket)
            self.log.info(
                "gs://%s exists in project %s already (Cloud Storage: you own it) and %s can write "
                "to it: kept as is",
                bucket,
                project,
                self.gcp_conn_id,
            )
        else:
            # This run created the bucket: recorded, so delete_bucket may later delete it whole.
            dag_id, run_id = self.run_ids(context)
            usage.record_creator(bucket, f"{dag_id}/{run_id}")
        return f"gs://{bucket}"


def bucket_name_taken(output: str) -> bool:
    """Cloud Storage refused to create the bucket because another project holds the name: a 409
    that does not say the bucket is already ours (``render/gke.py``, ``BUCKET_TAKEN``)."""
    return any(marker in output for marker in gke.BUCKET_TAKEN) and not any(
        marker in output for marker in gke.BUCKET_OURS
    )


# XCom key (of the token task) listing the service accounts this run granted secretAccessor.
GRANTED_XCOM_KEY = "granted_accounts"


class HfTokenSecretOperator(GclusterBaseOperator):
    """Put the HF token where the workloads read it: a Secret Manager secret, value over stdin.

    The readers it grants that had no access before are pushed to XCom (``granted_accounts``).
    With ``bucket`` and ``cluster_name`` (the cluster whose service accounts read it), the grants
    are also recorded in the cluster's resource record and held for it (``records/grants.py``):
    the cluster's destroy (the run's or the janitor's) takes back those it was the last to hold,
    never a binding that existed before or another holder still needs.

    :param project_id: project of the secret.
    :param hf_token_conn_id: Airflow connection holding the token (password field).
    :param hf_token_secret: the secret's id; empty = ``tpu-rl-hf-token-<conn id>``.
    :param sync_from_connection: write the connection's token into the secret (a new version);
        empty = only when ``hf_token_secret`` is empty (a named secret already holds the token).
    :param reader_service_accounts: service accounts granted ``secretAccessor`` on the secret.
    :param bucket: the run's bucket, where the cluster's resource record is.
    :param cluster_name: the cluster that holds the grants (its record names them).
    """

    template_fields: Sequence[str] = (
        "project_id",
        "hf_token_conn_id",
        "hf_token_secret",
        "sync_from_connection",
        "reader_service_accounts",
        "bucket",
        "cluster_name",
        "gcluster_conn_id",
        "gcp_conn_id",
        "impersonation_chain",
    )

    def __init__(
        self,
        *,
        project_id: str | None = None,
        hf_token_conn_id: str = "huggingface_default",
        hf_token_secret: str | None = None,
        sync_from_connection: bool | str | None = None,
        reader_service_accounts: Sequence[str] = (),
        bucket: str | None = None,
        cluster_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.project_id = project_id
        self.hf_token_conn_id = hf_token_conn_id
        self.hf_token_secret = hf_token_secret
        self.sync_from_connection = sync_from_connection
        self.reader_service_accounts = reader_service_accounts
        self.bucket = bucket
        self.cluster_name = cluster_name

    @fail_fast
    def execute(self, context: Context) -> str:
        project = rules.project_id("project_id", self.resolve_project_id())
        token = hf_token_spec(self.hf_token_conn_id, self.hf_token_secret or None)
        sync = (
            token.sync_from_connection
            if self.sync_from_connection in (None, "")
            else rules.boolean("sync_from_connection", self.sync_from_connection)
        )
        readers = tuple(
            rules.match(
                "reader_service_accounts", a, rules.SERVICE_ACCOUNT, "must be a service account e-mail"
            )
            for a in self.reader_service_accounts or ()
        )
        if sync:
            from airflow_provider_tpu_rl.hooks.hf_token import get_hf_token

            self.store_token(project, token.secret_id, get_hf_token(token.conn_id))
        granted = self.grant_readers(project, token.secret_id, readers) if readers else []
        # What this run added (and only that) is what its teardown may take back.
        context["ti"].xcom_push(key=GRANTED_XCOM_KEY, value=granted)
        return token.secret_id

    def grant_readers(self, project: str, secret_id: str, readers: Sequence[str]) -> list[str]:
        """Grant ``readers`` ``secretAccessor``; the ones that had no access before."""
        from airflow_provider_tpu_rl.records.grants import Binding, RunGrants

        if self.bucket and self.cluster_name:
            bucket = rules.bucket_name("bucket", self.bucket)
            bindings = [
                Binding("secret", project, secret_id, gke.SECRET_ACCESSOR, f"serviceAccount:{a}")
                for a in readers
            ]
            added = RunGrants(self.hook, self.gcp_conn_id, self.chain).grant(
                bucket, self.cluster_name, bindings
            )
            if added is not None:
                return [b.member.split(":", 1)[1] for b in added]
            self.log.warning(
                "cluster %s has no resource record in gs://%s: its grants are not recorded for its destroy",
                self.cluster_name,
                bucket,
            )
        present = self.accessors(project, secret_id)
        granted = []
        for account in readers:
            self.hook.run_checked(gke.grant_secret_accessor(project, secret_id, account))
            if f"serviceAccount:{account}" not in present:
                granted.append(account)
        return granted

    def accessors(self, project: str, secret_id: str) -> set[str]:
        """The members bound to ``secretAccessor`` on the secret now (unconditionally)."""
        described = self.hook.run_checked(gke.secret_iam_policy(project, secret_id), log_output=False)
        policy = parse_json_document(described.output_lines) or {}
        return {
            str(member)
            for binding in policy.get("bindings") or []
            if isinstance(binding, dict)
            and binding.get("role") == gke.SECRET_ACCESSOR
            and not binding.get("condition")
            for member in binding.get("members") or []
        }

    def store_token(self, project: str, secret_id: str, token: str) -> bool:
        """A new version only when the token differs from the stored one (the secret's annotation
        holds a salted HMAC of it); the older enabled versions are then disabled. Whether a version
        was added."""
        from airflow_provider_tpu_rl.hooks.hf_token import token_digest, token_matches_digest

        self.hook.run_checked(gke.create_secret(project, secret_id))
        described = self.hook.run_checked(gke.describe_secret(project, secret_id), log_output=False)
        annotations = (parse_json_document(described.output_lines) or {}).get("annotations") or {}
        if token_matches_digest(token, annotations.get(gke.TOKEN_DIGEST_ANNOTATION)):
            self.log.info("secret %s already holds this HF token: no new version", secret_id)
            return False
        self.hook.run_checked(gke.add_secret_version(project, secret_id), secrets={"hf_token": token})
        self.hook.run_checked(gke.annotate_secret_digest(project, secret_id, token_digest(token)))
        listed = self.hook.run_checked(gke.list_secret_versions(project, secret_id), log_output=False)
        enabled = enabled_secret_versions(listed.output_lines)
        for version in enabled[:-1]:
            self.hook.run_checked(gke.disable_secret_version(project, secret_id, str(version)))
        return True


class _ClusterOperator(GclusterBaseOperator):
    """The arguments that name and shape a Cluster Toolkit GKE deployment."""

    template_fields: Sequence[str] = (
        "project_id",
        "location",
        "zone",
        "cluster_name",
        "bucket",
        "reservation",
        "capacity",
        "model",
        "compute_type",
        "topology",
        "num_slices",
        "authorized_cidr",
        "max_cluster_hours",
        "gcluster_conn_id",
        "gcp_conn_id",
        "impersonation_chain",
    )

    def __init__(
        self,
        *,
        location: str,
        zone: str,
        cluster_name: str,
        bucket: str,
        reservation: str = "",
        capacity: str | list[str] | None = None,
        model: str | None = None,
        compute_type: str | None = None,
        topology: str | None = None,
        num_slices: int | str | None = None,
        authorized_cidr: str = "0.0.0.0/0",
        max_cluster_hours: int | str = 72,
        project_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.project_id = project_id
        self.location = location
        self.zone = zone
        self.cluster_name = cluster_name
        self.bucket = bucket
        self.reservation = reservation
        self.capacity = capacity
        self.model = model
        self.compute_type = compute_type
        self.topology = topology
        self.num_slices = num_slices
        self.authorized_cidr = authorized_cidr
        self.max_cluster_hours = max_cluster_hours

    def cluster_arguments(self) -> dict[str, Any]:
        """The cluster as plain values, as given (what the janitor's record keeps)."""
        return {
            "project": self.project_id,
            "region": self.location,
            "zone": self.zone,
            "cluster_name": self.cluster_name,
            "bucket": self.bucket,
            "reservation": self.reservation or "",
            "capacity": self.capacity or default_capacity(self.reservation),
            "compute_type": self.compute_type,
            "topology": self.topology,
            "num_slices": self.num_slices,
            "authorized_cidr": self.authorized_cidr,
        }

    def cluster(self) -> ClusterSpec:
        """The validated cluster; an empty ``project_id`` becomes the GCP connection's project."""
        self.resolve_project_id()
        return cluster_spec(self.cluster_arguments(), self.model)


def cluster_spec(arguments: Mapping[str, Any], model: str | None) -> ClusterSpec:
    """The cluster of a record or an operator's :meth:`~_ClusterOperator.cluster_arguments`
    (``project`` among them), by the spec's one derivation (``cluster_from_arguments``)."""
    values = dict(arguments)
    project = values.pop("project")
    return cluster_from_arguments(values, model, project=project)


def write_blueprint(
    hook: GclusterHook,
    cluster: ClusterSpec,
    labels: Mapping[str, str],
    workdir: str,
    *,
    stream_image: bool = False,
) -> None:
    """Copy the bundle's whole example folder into ``workdir`` and customise its blueprint there.

    The blueprint's ``$(ghpc_stage("./…"))`` files are resolved next to it, so the folder is
    copied whole; the blueprint is then replaced by its structured YAML edit.
    """
    source = hook.bundle_dir() / BLUEPRINT_RELPATH
    if not source.is_file():
        raise ConfigurationError(
            f"no blueprint {BLUEPRINT_RELPATH} in the Cluster Toolkit bundle {source.parents[2]}; "
            "set the gcluster connection's bundle_dir to the folder that holds examples/"
        )
    shutil.copytree(source.parent, workdir, dirs_exist_ok=True)
    base = source.read_text()
    Path(gke.blueprint_path(workdir)).write_text(
        customize_blueprint(
            base,
            cluster.blueprint,
            labels,
            reservation=bool(cluster.reservation),
            capacity=cluster.capacity,
            slice_vms=cluster.shape.vms,
            # the TPU pool in a group of its own: deployed and destroyed around the training alone
            tpu_quota=cluster.total_chips,
            stream_image=stream_image,
        )
    )


def blueprint_name(hook: GclusterHook) -> str:
    """The bundle blueprint's ``blueprint_name`` (the first part of its Terraform state prefix)."""
    import yaml

    source = hook.bundle_dir() / BLUEPRINT_RELPATH
    document = yaml.safe_load(source.read_text()) if source.is_file() else None
    name = document.get("blueprint_name") if isinstance(document, dict) else None
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"the blueprint {source} names no blueprint_name")
    return name


def group_selection(
    only_groups: Sequence[str] | str | None, skip_groups: Sequence[str] | str | None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``only_groups`` / ``skip_groups`` as tuples of deployment group names (a comma list or a
    list, as templated); both at once is refused, as gcluster refuses it."""

    def names(field: str, value: Sequence[str] | str | None) -> tuple[str, ...]:
        items = value.split(",") if isinstance(value, str) else list(value or ())
        out = tuple(str(item).strip() for item in items if str(item).strip())
        for name in out:
            rules.match(field, name, gke.GROUP_NAME, "must be a deployment group name like tpu")
        return out

    only, skip = names("only_groups", only_groups), names("skip_groups", skip_groups)
    if only and skip:
        raise ConfigurationError(
            "set only_groups or skip_groups, not both (gcluster refuses --only with --skip)"
        )
    return only, skip


def prepare_deployment_folder(hook: GclusterHook, cluster: ClusterSpec, workdir: str) -> None:
    """Recreate the deployment folder (its state is in GCS) and the primary group's outputs
    artifact, which the ``tpu`` group reads its inputs from (cluster-toolkit
    ``gatherUpstreamOutputs``; a fresh folder has none: "consider running gcluster export-outputs")."""
    hook.run_checked(gke.recreate_deployment_folder(cluster, workdir), cwd=workdir)
    hook.run_checked(gke.export_outputs(cluster, workdir, gke.PRIMARY_GROUP), cwd=workdir)


def destroy_cluster(
    hook: GclusterHook,
    cluster: ClusterSpec,
    *,
    dag_id: str,
    run_id: str,
    expires_at: int,
    only_groups: Sequence[str] = (),
) -> None:
    """Recreate the deployment folder on this worker (state is in GCS) and destroy from it
    (``only_groups``: those groups alone; an already destroyed group is a no-op).

    No lease check here: the callers decide (the destroy task: this run's lease; the janitor:
    the lease's expiry). The work folder is private and removed at the end.
    """
    hook.require_toolchain("deploy")
    suffix = run_suffix(dag_id, run_id)
    workdir = gke.make_workdir(cluster.cluster_name, suffix)
    try:
        write_blueprint(
            hook, cluster, gke.managed_labels(dag_id, suffix, cluster.bucket, expires_at), workdir
        )
        prepare_deployment_folder(hook, cluster, workdir)
        hook.run_checked(gke.destroy(cluster, workdir, only_groups=only_groups), cwd=workdir)
    finally:
        gke.remove_workdir(workdir)


def delete_run_bucket(
    operator: GclusterBaseOperator,
    context: Context,
    bucket: str,
    *,
    state_prefixes: Sequence[str] = (),
) -> dict[str, Any]:
    """``delete_bucket=true``, as one run may do it in a bucket other runs may share.

    Another run still using the bucket (a live or kept cluster lease, a live writer claim, a
    resource record of a run not known to have ended): nothing is deleted, one line says why. The
    bucket provably this run's (it created it, nothing in it names another run): deleted whole.
    Otherwise only this run's own folders and records go (``records/bucket_usage.py``).
    """
    from airflow_provider_tpu_rl.records.bucket_usage import BucketUsage, existing
    from airflow_provider_tpu_rl.records.janitor_sources import run_finished, run_probe

    dag_id, run_id = operator.run_ids(context)
    usage = BucketUsage(operator.gcp_conn_id, operator.chain)
    probe = run_probe(context)
    use = usage.survey(
        bucket,
        f"{dag_id}/{run_id}",
        finished=lambda holder: run_finished(probe, holder),
        run_suffix=run_suffix(dag_id, run_id),
        state_prefixes=state_prefixes,
    )
    if use.in_use:
        operator.log.error("%s", use.refusal())
        return {"bucket_deleted": False, "objects_deleted": [], "bucket_kept": use.refusal()}
    if use.whole:
        operator.log.warning("delete_bucket=true: deleting gs://%s and every checkpoint in it", bucket)
        operator.hook.run_checked(gke.delete_bucket(bucket))
        return {"bucket_deleted": True, "objects_deleted": [], "bucket_kept": None}
    names = existing(use.own, usage, bucket)
    why = f"gs://{bucket} is not this run's alone (it did not create it, or it holds other runs' objects)"
    if names:
        operator.log.warning(
            "delete_bucket=true: %s; deleting only this run's own: %s", why, ", ".join(names)
        )
        operator.hook.run_checked(gke.delete_objects(bucket, names))
    else:
        operator.log.warning("delete_bucket=true: %s, and nothing in it is this run's alone", why)
    return {"bucket_deleted": False, "objects_deleted": names, "bucket_kept": why}


# The least a lease lasts when taken (a late retry of deploy, close to the cluster's expiry).
LEASE_MIN_SECONDS = 600


def lease_ttl(expires_at: int, now: float | None = None) -> timedelta:
    """How long the deploy's lease lasts: up to the cluster's expiry label (the run's start plus
    ``max_cluster_hours``, when the janitor destroys the cluster anyway), so it covers the whole
    run (conversion, training, export) without a renewal; at least ten minutes."""
    left = expires_at - (time.time() if now is None else now)
    return timedelta(seconds=max(left, LEASE_MIN_SECONDS))


def take_cluster_lease(
    gcp_conn_id: str,
    cluster: ClusterSpec,
    *,
    dag_id: str,
    run_id: str,
    expires_at: int,
    impersonation_chain: str | Sequence[str] | None = None,
) -> Lease:
    """Take (or renew) the cluster's lease for this run; another run's live lease fails the task
    in one line ("cluster X is in use by run Y until ...")."""
    try:
        return ClusterLeaseHook(gcp_conn_id, impersonation_chain).acquire(
            cluster.bucket, cluster.cluster_name, dag_id=dag_id, run_id=run_id, ttl=lease_ttl(expires_at)
        )
    except LeaseHeldError as err:
        raise AirflowFailException(str(err)) from None


class GclusterDeployOperator(_ClusterOperator):
    """Deploy a Cluster Toolkit GKE cluster with TPU v6e slices (Terraform state in the bucket).

    Idempotent: ``gcluster deploy -w`` on a healthy deployment with the same inputs changes nothing.

    :param project_id: project of the cluster; empty: the GCP connection's project.
    :param location: region of the cluster.
    :param zone: zone of the TPU node pool (inside ``location``).
    :param cluster_name: GKE cluster / deployment name (``[a-z][a-z0-9-]*``, at most 20 characters).
    :param bucket: bucket for the Terraform state and the janitor's record.
    :param reservation: TPU reservation the node pool consumes (``reservation`` capacity).
    :param capacity: how the TPU node pool is provisioned: ``on-demand`` (no reservation),
        ``reservation`` (the reservation named), ``spot`` (Spot VMs) or ``flex-start`` (DWS
        flex-start), or an ordered list of them the TPU pool's deploy falls through
        (:meth:`deploy_pool_falling_through`; a flex-start pool before other kinds is proved by a
        placeholder pod, :func:`flex_start_refusal`); empty: ``reservation`` when
        one is named, else ``on-demand``.
    :param model: a model preset name: it sets the blueprint edits and the slice shape left empty.
    :param compute_type: TPU machine type (default the preset's, ``ct6e-standard-4t``).
    :param topology: slice topology (default the preset's, ``4x8``).
    :param num_slices: number of TPU node pools (default 1).
    :param authorized_cidr: the control plane's authorized network: the CIDR allowed to reach the
        cluster's Kubernetes API. ``0.0.0.0/0`` (the tutorials') opens it to any address; narrow it
        to where Airflow runs (on Cloud Composer, the environment's egress range).
    :param keep_cluster: recorded for the janitor: a kept cluster is only destroyed at its expiry.
    :param max_cluster_hours: the cluster's expiry label, counted from the DAG run's start.
    :param skip_groups: deployment groups not to deploy (``gcluster deploy --skip``), e.g.
        ``["tpu"]``: the cluster without its TPU node pool.
    :param only_groups: deploy only these groups (``gcluster deploy --only``) of a cluster whose
        lease this run already holds (taken by a deploy of the other groups), e.g. ``["tpu"]``:
        the TPU node pool alone, once the work that needs it is ready. Not with ``skip_groups``.
    :param image_repository: the Artifact Registry repository the training image is copied into
        (``CopyWorkloadImageOperator``): named, the TPU node pool streams its image (``enable_gcfs``
        and Service Usage Consumer for its account); empty: the pool pulls the image whole.
    """

    ui_color = "#d4e8ff"
    template_fields: Sequence[str] = (
        *_ClusterOperator.template_fields,
        "keep_cluster",
        "skip_groups",
        "only_groups",
        "image_repository",
    )
    operator_extra_links = (GKEClusterLink(),)

    def __init__(
        self,
        *,
        keep_cluster: bool | str = False,
        skip_groups: Sequence[str] | str | None = None,
        only_groups: Sequence[str] | str | None = None,
        image_repository: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.keep_cluster = keep_cluster
        self.skip_groups = skip_groups
        self.only_groups = only_groups
        self.image_repository = image_repository

    @property
    def stream_image(self) -> bool:
        """The TPU node pool streams its image (``image_repository`` named: the image is copied there)."""
        return bool(image_repository(self.image_repository))

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        cluster = self.cluster()
        only, skip = group_selection(self.only_groups, self.skip_groups)
        # The link works from the start: the console shows the cluster while it is being created,
        # and its node pools (a group deployed alone, the TPU pool) on the same page. Every try of
        # every deploy saves it: a link registered and never saved shows an empty "Extra Links".
        GKEClusterLink.persist(
            context, project_id=cluster.project, location=cluster.region, cluster_name=cluster.cluster_name
        )
        if only:
            return self.deploy_groups(context, cluster, only)
        # Terraform, Packer, git: refused in one line here, never by gcluster's [y/N] prompt
        self.hook.require_toolchain("deploy")
        dag_id, run_id = self.run_ids(context)
        expires_at = expiry_of_run(context, rules.integer("max_cluster_hours", self.max_cluster_hours, 1))
        kept_from = self.kept_from(cluster, dag_id, run_id)
        # The lease first: a run that does not hold it never writes the record nor deploys.
        lease = take_cluster_lease(
            self.gcp_conn_id,
            cluster,
            dag_id=dag_id,
            run_id=run_id,
            expires_at=expires_at,
            impersonation_chain=self.chain,
        )
        self.log.info(
            "cluster %s: lease held by run %s until %s, or until a GclusterDestroyOperator of this run "
            "releases it; without one, no other run may deploy or destroy it until then",
            cluster.cluster_name,
            lease.holder,
            utc_text(lease.expires_at),
        )
        write_resource_record(
            self.gcp_conn_id,
            cluster.bucket,
            cluster.cluster_name,
            {
                "kind": "cluster",
                "name": cluster.cluster_name,
                "dag_id": dag_id,
                "run_id": run_id,
                "cluster": self.cluster_arguments(),
                "model": self.model,
                "expires_at": expires_at,
                "keep": rules.boolean("keep_cluster", self.keep_cluster),
                # the run that handed the cluster over with keep_cluster (a retry of this deploy reads it)
                **({"kept_from": kept_from} if kept_from else {}),
                # the grants the cluster holds (a re-deploy, or a kept cluster taken over, keeps them)
                **carried_grants(self.gcp_conn_id, cluster.bucket, cluster.cluster_name, self.chain),
            },
            self.chain,
        )
        suffix = run_suffix(dag_id, run_id)
        labels = gke.managed_labels(dag_id, suffix, cluster.bucket, expires_at)
        workdir = gke.make_workdir(cluster.cluster_name, suffix)
        try:
            write_blueprint(self.hook, cluster, labels, workdir, stream_image=self.stream_image)
            started = time.time()
            # No project-level grants: the blueprint's service-account modules hold the roles.
            self.hook.run_checked(gke.deploy(cluster, workdir, skip_groups=skip), cwd=workdir)
            deploy_seconds = round(time.time() - started, 3)
        finally:
            gke.remove_workdir(workdir)
        # Renewed after the deploy (which may take long): the lease still runs to the expiry.
        lease = ClusterLeaseHook(self.gcp_conn_id, self.chain).renew(
            cluster.bucket, lease, lease_ttl(expires_at)
        )
        return {
            "cluster_name": cluster.cluster_name,
            "project": cluster.project,
            "chips": cluster.total_chips,
            "deploy_seconds": deploy_seconds,
            "expires_at": expires_at,
            "lease_expires_at": int(lease.expires_at),
            "skipped_groups": list(skip),
            # for the ledger: a cluster this run deployed, or one an earlier run kept for it
            "cluster_origin": CLUSTER_KEPT if kept_from else CLUSTER_CREATED,
            "kept_from": kept_from,
        }

    def kept_from(self, cluster: ClusterSpec, dag_id: str, run_id: str) -> str | None:
        """The run that handed the cluster over with ``keep_cluster`` when this run takes it over
        (its lease, read before it is taken, says ``kept``), or that an earlier try of this deploy
        took over (the cluster's record of this run says so); None: the cluster is this run's own."""
        holder = f"{dag_id}/{run_id}"
        lease = ClusterLeaseHook(self.gcp_conn_id, self.chain).read(cluster.bucket, cluster.cluster_name)
        if lease is not None and lease.kept and lease.holder != holder:
            return lease.holder
        if lease is None or lease.holder != holder:
            return None
        record = read_resource_record(self.gcp_conn_id, cluster.bucket, cluster.cluster_name, self.chain)
        if record is None or (record.get("dag_id"), record.get("run_id")) != (dag_id, run_id):
            return None
        return str(record["kept_from"]) if record.get("kept_from") else None

    def deploy_groups(self, context: Context, cluster: ClusterSpec, only: tuple[str, ...]) -> dict[str, Any]:
        """Deploy ``only`` groups of a cluster this run holds the lease of (never takes it: the
        deploy of the cluster did; a run without it leaves the cluster alone)."""
        self.hook.require_toolchain("deploy")
        dag_id, run_id = self.run_ids(context)
        lease = require_own_lease(self.gcp_conn_id, cluster, f"{dag_id}/{run_id}", self.chain)
        expires_at = expiry_of_run(context, rules.integer("max_cluster_hours", self.max_cluster_hours, 1))
        suffix = run_suffix(dag_id, run_id)
        workdir = gke.make_workdir(cluster.cluster_name, suffix)
        labels = gke.managed_labels(dag_id, suffix, cluster.bucket, expires_at)
        try:
            started = time.time()
            if TPU_GROUP in only and cluster.fallback:
                cluster = self.deploy_pool_falling_through(context, cluster, only, labels, workdir)
            else:
                write_blueprint(self.hook, cluster, labels, workdir, stream_image=self.stream_image)
                prepare_deployment_folder(self.hook, cluster, workdir)
                self.hook.run_checked(gke.deploy_groups(cluster, workdir, only), cwd=workdir)
            deploy_seconds = round(time.time() - started, 3)
        finally:
            gke.remove_workdir(workdir)
        if TPU_GROUP in only:  # the TPU nodes' clocks, for the ledger
            billing.note_pool_nodes(self, cluster, since=datetime.fromtimestamp(started, UTC))
        return {
            "cluster_name": cluster.cluster_name,
            "project": cluster.project,
            "chips": cluster.total_chips,
            "groups": list(only),
            "deploy_seconds": deploy_seconds,
            "lease_expires_at": int(lease.expires_at),
        }

    def deploy_pool_falling_through(
        self,
        context: Context,
        cluster: ClusterSpec,
        only: tuple[str, ...],
        labels: Mapping[str, str],
        workdir: str,
    ) -> ClusterSpec:
        """Deploy the TPU node pool with the first of the cluster's ordered capacity kinds GKE
        gives: a pool whose create is refused for lack of capacity (``capacity_refused``) is one
        log line, then destroyed (its group alone: nothing of it bills or lingers) before the next
        kind's blueprint is deployed; so is a flex-start pool with kinds after it whose placeholder
        pod gets no node (:func:`flex_start_refusal`; flex-start last queues, as alone). Any other
        failure stops as a one-kind deploy does. The kind
        that served goes into the ``capacity`` XCom with the refused attempts; all refused is one
        line listing each (a capacity failure: the task's retries may try again)."""
        dag_id, run_id = self.run_ids(context)
        record = (
            read_resource_record(self.gcp_conn_id, cluster.bucket, cluster.cluster_name, self.chain) or {}
        )
        mine = record.get("run_id") == run_id and record.get("dag_id") == dag_id
        served = record.get("capacity_served") if mine else None
        # an earlier try of this run got ``served``: its pool may stand, so it is tried first (a
        # deploy of the pool as it is changes nothing) and the kinds refused then stay recorded
        kinds = (
            [served, *(k for k in cluster.capacities if k != served)]
            if served in cluster.capacities
            else list(cluster.capacities)
        )
        attempts: list[dict[str, str]] = (
            [dict(a) for a in record.get("capacity_attempts") or []] if served else []
        )
        for kind in kinds:
            attempt = cluster.attempt(kind)
            write_blueprint(self.hook, attempt, labels, workdir, stream_image=self.stream_image)
            prepare_deployment_folder(self.hook, attempt, workdir)
            try:
                self.hook.run_checked(gke.deploy_groups(attempt, workdir, only), cwd=workdir)
                # a flex-start pool is created empty and queues: with kinds after it, a placeholder
                # pod proves its nodes come (or the autoscaler says they cannot) before it counts
                refused = (
                    flex_start_refusal(self.gcp_conn_id, self.chain, attempt)
                    if kind == FLEX_START and kind != kinds[-1]
                    else None
                )
            except CommandError as err:
                if not capacity_refused(str(err)):
                    raise
                said = str(err).splitlines()[0].removesuffix("; last output:")
                refused = said[said.find("Error:") :] if "Error:" in said else said
            if refused is not None:
                attempts.append({"capacity": kind, "error": refused})
                self.log.warning("Capacity %s refused: %s", kind, refused)
                self.hook.run_checked(gke.destroy(attempt, workdir, only_groups=only), cwd=workdir)
                continue
            self.log.info(
                "Capacity %s: the TPU node pool of %s deployed after %d refused kind(s)",
                kind,
                cluster.cluster_name,
                len(attempts),
            )
            if mine:  # the cluster's record keeps the kind for a retry (and the janitor)
                write_resource_record(
                    self.gcp_conn_id,
                    cluster.bucket,
                    cluster.cluster_name,
                    {**record, "capacity_served": kind, "capacity_attempts": attempts},
                    self.chain,
                )
            context["ti"].xcom_push(key=CAPACITY_XCOM_KEY, value={"served": kind, "attempts": attempts})
            return attempt
        raise CommandError(
            f"TPU node pool of cluster {cluster.cluster_name}: no capacity kind could create it in "
            f"{cluster.zone}: " + "; ".join(f"{a['capacity']}: {a['error']}" for a in attempts),
            FailureKind.CAPACITY,
        )


# How often the flex-start probe reads its placeholder pod and its events: the cluster
# autoscaler's own scan interval (kubernetes/autoscaler cluster-autoscaler/FAQ.md: scan-interval 10 s).
CAPACITY_PROBE_POLL_SECONDS = 10.0


def flex_start_refusal(
    gcp_conn_id: str, impersonation_chain: str | Sequence[str] | None, cluster: ClusterSpec
) -> str | None:
    """Whether ``cluster``'s just created flex-start TPU pool gets its nodes: a placeholder pod
    asks for its TPUs (:func:`render.gke.capacity_probe_pod`) and is read until the scheduler places
    it (None: capacity came; the pod is deleted and the nodes stay, unneeded for the autoscaler's
    ``scale-down-unneeded-time``, 10 min, while the training's submit follows) or the autoscaler's
    ``FailedScaleUp`` says the zone has none (``GCE out of resources``/``GCE quota exceeded``), or
    ``[tpu_rl] flex_start_probe_timeout_minutes`` passes: the refusal's one line. The pod is deleted
    either way. A synchronous wait in the task: bounded (10 min by default) and between a pool's
    create and the next kind's, which a deferral could not resume in the same loop."""
    import asyncio

    from airflow_provider_tpu_rl.hooks.kubernetes import (
        GkeClusterHook,
        JobSetClient,
        pod_scheduled,
        scale_up_refusal,
    )
    from airflow_provider_tpu_rl.render.blueprint import V6E_ACCELERATOR
    from airflow_provider_tpu_rl.timeouts import flex_start_probe_timeout

    bound = flex_start_probe_timeout()
    manifest = gke.capacity_probe_pod(cluster, V6E_ACCELERATOR)
    name, namespace = gke.capacity_probe_name(cluster.cluster_name), gke.CAPACITY_PROBE_NAMESPACE

    async def probe() -> str | None:
        access = await asyncio.to_thread(
            GkeClusterHook(gcp_conn_id, cluster.region, impersonation_chain).cluster_access,
            cluster.cluster_name,
            cluster.project,
        )
        client = JobSetClient(access, gcp_conn_id, impersonation_chain)
        try:
            async with client.connection() as api:
                await client.delete_pod(api, namespace, name)  # an earlier try's, if it stayed
                await client.create_pod(api, namespace, manifest)
                try:
                    deadline = time.monotonic() + bound
                    while True:
                        pod = await client.read_pod(api, namespace, name)
                        if pod is not None and pod_scheduled(pod):
                            return None
                        said = scale_up_refusal(await client.pod_events(api, namespace, name))
                        if said is not None:
                            return said
                        if time.monotonic() >= deadline:
                            return (
                                f"no node came for a placeholder pod on the flex-start pool in "
                                f"{bound / 60:g} min ([tpu_rl] flex_start_probe_timeout_minutes)"
                            )
                        await asyncio.sleep(
                            min(CAPACITY_PROBE_POLL_SECONDS, max(0.0, deadline - time.monotonic()))
                        )
                finally:
                    await client.delete_pod(api, namespace, name)
        finally:
            await client.close()

    return asyncio.run(probe())


def require_own_lease(
    gcp_conn_id: str, cluster: ClusterSpec, holder: str, impersonation_chain: str | Sequence[str] | None
) -> Lease:
    """This run's live lease of the cluster; anything else fails the task in one line."""
    lease = ClusterLeaseHook(gcp_conn_id, impersonation_chain).read(cluster.bucket, cluster.cluster_name)
    if lease is not None and lease.holder == holder and not lease.expired():
        return lease
    if lease is None:
        why = "nobody holds its lease"
    elif lease.holder != holder:
        why = f"its lease is held by run {lease.holder}"
    else:
        why = f"this run's lease expired at {utc_text(lease.expires_at)}"
    raise AirflowFailException(
        f"cluster {cluster.cluster_name}: {why}; this run deploys no node pool into it (the task "
        "that deploys the cluster takes the lease first)"
    )


class GclusterDestroyOperator(_ClusterOperator):
    """Destroy the cluster from its GCS state on any worker; an absent cluster is success.

    Only a cluster this run holds the lease of is destroyed (or, with no lease at all, one whose
    resource record says this run created it): a run that failed before taking the lease, or
    found the cluster in use by another run, leaves it alone. The lease is released at the end
    (with ``keep_cluster``: marked kept, for a later run naming the cluster to take over). Once the
    cluster is destroyed, the grants its resource record lists are let go of (``records/grants.py``:
    each removed when the cluster was its last holder and it did not exist before); the TPU pool's
    destroy lets go of none (the export that follows reads the token with the same accounts).

    Takes the same arguments as :class:`GclusterDeployOperator`, plus:

    :param keep_cluster: leave the cluster running (it bills until its expiry).
    :param delete_bucket: also delete the bucket, **with every checkpoint and export in it**.
    :param hf_token_conn_id: the HF token's connection (names the default secret).
    :param hf_token_secret: the HF token secret the cluster's service accounts were granted.
    :param revoke_service_accounts: the ``secretAccessor`` grants to take back once the cluster is
        destroyed: the ones this run added (the token task's ``granted_accounts`` XCom); empty =
        none. One the cluster's record lists is decided by its holders instead. A binding this run
        did not add is never revoked.
    """

    ui_color = "#ffd9d4"
    template_fields: Sequence[str] = (
        *_ClusterOperator.template_fields,
        "keep_cluster",
        "delete_bucket",
        "hf_token_conn_id",
        "hf_token_secret",
        "revoke_service_accounts",
    )

    def __init__(
        self,
        *,
        keep_cluster: bool | str = False,
        delete_bucket: bool | str = False,
        hf_token_conn_id: str = "huggingface_default",
        hf_token_secret: str | None = None,
        revoke_service_accounts: Sequence[str] | str | None = None,
        only_groups: Sequence[str] | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.only_groups = only_groups
        self.keep_cluster = keep_cluster
        self.delete_bucket = delete_bucket
        self.hf_token_conn_id = hf_token_conn_id
        self.hf_token_secret = hf_token_secret
        self.revoke_service_accounts = revoke_service_accounts

    def owned_lease(self, cluster: ClusterSpec, dag_id: str, run_id: str) -> tuple[bool, Lease | None]:
        """Whether this run may tear the cluster down, and its lease (``None``: nobody's)."""
        lease = ClusterLeaseHook(self.gcp_conn_id, self.chain).read(cluster.bucket, cluster.cluster_name)
        holder = f"{dag_id}/{run_id}"
        if lease is not None:
            if lease.holder == holder:
                return True, lease
            if lease.kept:
                why = f"cluster {cluster.cluster_name} is kept by run {lease.holder}"
            elif lease.expired():
                why = (
                    f"cluster {cluster.cluster_name} is leased to run {lease.holder} (expired: the janitor's)"
                )
            else:
                why = held_message(lease)
            self.log.warning("%s: this run does not hold its lease and leaves it alone", why)
            return False, lease
        record = read_resource_record(self.gcp_conn_id, cluster.bucket, cluster.cluster_name, self.chain)
        if record is not None and f"{record.get('dag_id')}/{record.get('run_id')}" == holder:
            return True, None
        self.log.warning(
            "cluster %s: nobody holds its lease and this run did not create it (record: %s): left alone",
            cluster.cluster_name,
            f"run {record.get('dag_id')}/{record.get('run_id')}" if record else "none",
        )
        return False, None

    def revoke_secret_access(self, cluster: ClusterSpec, recorded: set[str]) -> list[str]:
        """Take back the ``secretAccessor`` grants this run added (``revoke_service_accounts``)
        that its record does not list (``recorded``: its holders decide those); what it revoked."""
        accounts = self.revoke_service_accounts or []
        if isinstance(accounts, str):
            accounts = [a.strip() for a in accounts.split(",") if a.strip()]
        token = hf_token_spec(self.hf_token_conn_id, self.hf_token_secret or None)
        revoked = []
        for account in accounts:
            rules.match(
                "revoke_service_accounts", account, rules.SERVICE_ACCOUNT, "must be a service account e-mail"
            )
            if f"serviceAccount:{account}" in recorded:
                continue
            self.hook.run_checked(gke.revoke_secret_accessor(cluster.project, token.secret_id, account))
            revoked.append(account)
        return revoked

    def release_grants(self, cluster: ClusterSpec) -> tuple[list[str], list[str]]:
        """Let go of the grants the destroyed cluster held: ``(accounts revoked, bindings removed)``."""
        record = read_resource_record(self.gcp_conn_id, cluster.bucket, cluster.cluster_name, self.chain)
        token = hf_token_spec(self.hf_token_conn_id, self.hf_token_secret or None)
        recorded = {
            b.member for b in recorded_grants(record) if b.kind == "secret" and b.name == token.secret_id
        }
        removed = RunGrants(self.hook, self.gcp_conn_id, self.chain).release(
            cluster.bucket, cluster.cluster_name
        )
        accounts = [
            b.member.split(":", 1)[1] for b in removed if b.role == gke.SECRET_ACCESSOR and b.kind == "secret"
        ]
        accounts += self.revoke_secret_access(cluster, recorded)
        return accounts, [b.text() for b in removed]

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        cluster = self.cluster()
        only, _ = group_selection(self.only_groups, None)
        if only:
            return self.destroy_groups(context, cluster, only)
        keep, delete_bucket = (
            rules.boolean("keep_cluster", self.keep_cluster),
            rules.boolean("delete_bucket", self.delete_bucket),
        )
        dag_id, run_id = self.run_ids(context)
        owned, lease = self.owned_lease(cluster, dag_id, run_id)
        leases = ClusterLeaseHook(self.gcp_conn_id, self.chain)
        destroyed = False
        revoked: list[str] = []
        removed: list[str] = []
        if not owned:
            pass
        elif keep:
            self.log.warning("keep_cluster=true: cluster %s is left running (it bills)", cluster.cluster_name)
            if lease is not None:
                leases.release(cluster.bucket, lease, keep=True)
                self.log.info(
                    "cluster %s: lease marked kept, for a later run to take over", cluster.cluster_name
                )
        else:
            expires_at = expiry_of_run(context, rules.integer("max_cluster_hours", self.max_cluster_hours, 1))
            destroy_cluster(self.hook, cluster, dag_id=dag_id, run_id=run_id, expires_at=expires_at)
            destroyed = True
            revoked, removed = self.release_grants(cluster)
            if lease is not None:
                leases.release(cluster.bucket, lease)
        deleted: dict[str, Any] = {"bucket_deleted": False, "objects_deleted": [], "bucket_kept": None}
        if delete_bucket:
            state = [gke.state_prefix(blueprint_name(self.hook), cluster.cluster_name)] if destroyed else []
            deleted = delete_run_bucket(self, context, cluster.bucket, state_prefixes=state)
        return {
            "cluster_name": cluster.cluster_name,
            "destroyed": destroyed,
            "revoked_accounts": revoked,
            "removed_grants": removed,
            **deleted,
            "lease_holder": lease.holder if lease is not None else None,
        }

    def destroy_groups(self, context: Context, cluster: ClusterSpec, only: tuple[str, ...]) -> dict[str, Any]:
        """Destroy ``only`` groups of a cluster this run may tear down; the rest stays."""
        dag_id, run_id = self.run_ids(context)
        owned, lease = self.owned_lease(cluster, dag_id, run_id)
        billed = owned and TPU_GROUP in only  # the TPU nodes' clocks, for the ledger
        if billed:
            billing.note_pool_nodes(self, cluster)  # their latest starts, before they go
        if owned:
            expires_at = expiry_of_run(context, rules.integer("max_cluster_hours", self.max_cluster_hours, 1))
            destroy_cluster(
                self.hook, cluster, dag_id=dag_id, run_id=run_id, expires_at=expires_at, only_groups=only
            )
        result = {
            "cluster_name": cluster.cluster_name,
            "groups": list(only),
            "destroyed": owned,
            "lease_holder": lease.holder if lease is not None else None,
        }
        if billed:
            result[billing.XCOM_KEY] = billing.pool_billed(self, cluster)
        return result
