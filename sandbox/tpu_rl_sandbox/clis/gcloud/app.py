"""Fake ``gcloud``: the subset the provider uses, with gcloud's argument rules and messages.

The command groups live in a module each; :class:`Gcloud` joins them all, for in-process use (the
tests, the bench), on :class:`~tpu_rl_sandbox.clis.gcloud.dispatch.GcloudDispatch`, which
dispatches a call to its ``cmd_<path>`` handler. A call of the fake (``python -m
tpu_rl_sandbox.clis.gcloud ARGS``, the ``<root>/bin/gcloud`` shim) joins only its command's group
(:mod:`.dispatch`). Buckets and objects live in fake-gcs-server; everything else (secrets,
IAM, VMs, clusters) in the sandbox state.
"""

from __future__ import annotations

from tpu_rl_sandbox.clis.gcloud.artifacts import ArtifactsCommands
from tpu_rl_sandbox.clis.gcloud.auth import AuthCommands
from tpu_rl_sandbox.clis.gcloud.compute_instances import InstancesCommands
from tpu_rl_sandbox.clis.gcloud.compute_networks import NetworksCommands
from tpu_rl_sandbox.clis.gcloud.compute_operations import OperationsCommands
from tpu_rl_sandbox.clis.gcloud.compute_project_info import ProjectInfoCommands
from tpu_rl_sandbox.clis.gcloud.compute_reservations import ReservationsCommands
from tpu_rl_sandbox.clis.gcloud.compute_ssh import SshCommand
from tpu_rl_sandbox.clis.gcloud.container_clusters import ClustersCommands
from tpu_rl_sandbox.clis.gcloud.container_images import ContainerImagesCommands
from tpu_rl_sandbox.clis.gcloud.container_node_pools import NodePoolsCommands
from tpu_rl_sandbox.clis.gcloud.dispatch import GcloudDispatch
from tpu_rl_sandbox.clis.gcloud.projects import ProjectsCommands
from tpu_rl_sandbox.clis.gcloud.secrets import SecretsCommands
from tpu_rl_sandbox.clis.gcloud.services import ServicesCommands
from tpu_rl_sandbox.clis.gcloud.storage import StorageCommands


class Gcloud(
    GcloudDispatch,
    StorageCommands,
    AuthCommands,
    ProjectsCommands,
    SecretsCommands,
    SshCommand,
    InstancesCommands,  # with ImagesCommands (instances boot from images)
    OperationsCommands,
    ReservationsCommands,
    NetworksCommands,
    ProjectInfoCommands,
    ServicesCommands,
    ClustersCommands,
    NodePoolsCommands,
    ContainerImagesCommands,
    ArtifactsCommands,
):
    """One ``gcloud`` invocation, every command group the sandbox knows (a call of the fake joins
    only its command's group: :func:`~tpu_rl_sandbox.clis.gcloud.dispatch.gcloud_class`)."""
