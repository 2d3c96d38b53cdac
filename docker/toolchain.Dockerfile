# syntax=docker/dockerfile:1
# The tools gcluster needs, pinned, in one small image running as a non-root user: what a
# Kubernetes pod (or docker/Dockerfile, which copies them) runs gcluster with.
#
#   /opt/cluster-toolkit/gcluster, /opt/cluster-toolkit/examples/   the Cluster Toolkit release bundle
#   /usr/local/bin/terraform, /usr/local/bin/packer                  HashiCorp zips, SHA-256 verified
#   /opt/google-cloud-sdk/bin/{gcloud,kubectl,gke-gcloud-auth-plugin}, gcloud's alpha commands
#   git, openssh-client, python3 (for gcloud)                        Debian bookworm packages, pinned
#
# Build (context = repository root; the bundle checksum is required, see below):
#   docker build -f docker/toolchain.Dockerfile \
#     --build-arg GCLUSTER_BUNDLE_SHA256=<sha256 of gcluster_bundle_linux_amd64.tgz> \
#     -t tpu-rl-toolchain:v1.103.0 .
# A gcluster connection for this image: {"gcluster_path": "/opt/cluster-toolkit/gcluster",
# "bundle_dir": "/opt/cluster-toolkit", "install_tools": false}.
#
# One source for the pins: the ARG defaults below equal airflow_provider_tpu_rl/hooks/toolchain.py
# (TERRAFORM_VERSION, TERRAFORM_SHA256, PACKER_VERSION, PACKER_SHA256) and
# hooks/connection_fields.py (CLUSTER_TOOLKIT_DEFAULT_VERSION); tests/docker/test_dockerfiles.py
# fails when they drift. Checksums not knowable offline are NOT invented:
#   * GCLUSTER_BUNDLE_SHA256: the release publishes no checksum file (hooks/bundle.py); the build
#     refuses without one, as the hook refuses to download the bundle without the connection's sha256.
#     Use the same value in both.
#   * GCLOUD_SHA256: Google publishes no checksum for a versioned google-cloud-cli archive; when the
#     ARG is empty the archive's digest is printed in the build log ("UNVERIFIED") and kept in
#     /opt/google-cloud-sdk.tar.gz.sha256 — pass it as GCLOUD_SHA256 to pin later builds.
#   * kubectl and gke-gcloud-auth-plugin are gcloud components: their versions are those of the
#     GCLOUD_VERSION component snapshot, installed by gcloud's component manager.
#   * The Debian packages are pinned to versions; apt checks them against the signed archive.
#   * The base image is pinned by tag; pin its digest with --build-arg DEBIAN_IMAGE=debian@sha256:...

ARG DEBIAN_IMAGE=debian:bookworm-slim

FROM ${DEBIAN_IMAGE} AS download
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates=20230311+deb12u1 \
        curl=7.88.1-10+deb12u15 \
        unzip=6.0-28 \
    && rm -rf /var/lib/apt/lists/*
COPY docker/fetch_verified.sh /usr/local/bin/fetch-verified

# BuildKit sets TARGETARCH (amd64 | arm64); the classic builder leaves it empty: amd64.
ARG TARGETARCH
ARG TERRAFORM_VERSION=1.12.2
ARG TERRAFORM_SHA256_LINUX_AMD64=1eaed12ca41fcfe094da3d76a7e9aa0639ad3409c43be0103ee9f5a1ff4b7437
ARG TERRAFORM_SHA256_LINUX_ARM64=f8a0347dc5e68e6d60a9fa2db361762e7943ed084a773f28a981d988ceb6fdc9
ARG PACKER_VERSION=1.15.0
ARG PACKER_SHA256_LINUX_AMD64=2fd1149c5c6c7604ced64d7b56638af05f6b7ed3f6835182bc913ddaba1f16b8
ARG PACKER_SHA256_LINUX_ARM64=1687f43bd120601f62e54b970b1cc06f83e95897357dc5c679b57ec9d2fb40a7
ARG HASHICORP_BASE_URL=https://releases.hashicorp.com
WORKDIR /tmp/tools
RUN arch="${TARGETARCH:-amd64}" \
    && case "$arch" in \
         amd64) tf_sha="$TERRAFORM_SHA256_LINUX_AMD64"; packer_sha="$PACKER_SHA256_LINUX_AMD64" ;; \
         arm64) tf_sha="$TERRAFORM_SHA256_LINUX_ARM64"; packer_sha="$PACKER_SHA256_LINUX_ARM64" ;; \
         *) echo "unsupported TARGETARCH $arch" >&2; exit 1 ;; \
       esac \
    && fetch-verified "$HASHICORP_BASE_URL/terraform/$TERRAFORM_VERSION/terraform_${TERRAFORM_VERSION}_linux_${arch}.zip" \
         terraform.zip "$tf_sha" \
    && fetch-verified "$HASHICORP_BASE_URL/packer/$PACKER_VERSION/packer_${PACKER_VERSION}_linux_${arch}.zip" \
         packer.zip "$packer_sha" \
    && mkdir -p /out/bin \
    && unzip -q -o terraform.zip terraform -d /out/bin \
    && unzip -q -o packer.zip packer -d /out/bin \
    && chmod 0755 /out/bin/terraform /out/bin/packer

ARG CLUSTER_TOOLKIT_VERSION=v1.103.0
ARG GCLUSTER_BUNDLE_SHA256=
ARG CLUSTER_TOOLKIT_RELEASE_URL=https://github.com/GoogleCloudPlatform/cluster-toolkit/releases/download
RUN arch="${TARGETARCH:-amd64}" \
    && if [ -z "$GCLUSTER_BUNDLE_SHA256" ]; then \
         echo "GCLUSTER_BUNDLE_SHA256 is required: Cluster Toolkit publishes no checksum for" \
              "gcluster_bundle_linux_${arch}.tgz ($CLUSTER_TOOLKIT_VERSION); download it once, check it," \
              "and pass its sha256 (the gcluster connection's sha256 extra takes the same value)" >&2; \
         exit 1; \
       fi \
    && fetch-verified "$CLUSTER_TOOLKIT_RELEASE_URL/$CLUSTER_TOOLKIT_VERSION/gcluster_bundle_linux_${arch}.tgz" \
         bundle.tgz "$GCLUSTER_BUNDLE_SHA256" \
    && mkdir -p /out/cluster-toolkit \
    && tar -xzf bundle.tgz -C /out/cluster-toolkit --no-same-owner \
    && test -x /out/cluster-toolkit/gcluster \
    && test -d /out/cluster-toolkit/examples/gke-tpu-v6e

ARG GCLOUD_VERSION=528.0.0
ARG GCLOUD_SHA256=
RUN arch="${TARGETARCH:-amd64}" \
    && case "$arch" in amd64) sdk_arch=x86_64 ;; arm64) sdk_arch=arm ;; *) exit 1 ;; esac \
    && fetch-verified "https://dl.google.com/dl/cloudsdk/channels/rapid/downloads/google-cloud-cli-${GCLOUD_VERSION}-linux-${sdk_arch}.tar.gz" \
         google-cloud-sdk.tar.gz "$GCLOUD_SHA256" \
    && tar -xzf google-cloud-sdk.tar.gz -C /out --no-same-owner \
    && cp google-cloud-sdk.tar.gz.sha256 /out/google-cloud-sdk.tar.gz.sha256

FROM ${DEBIAN_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates=20230311+deb12u1 \
        git=1:2.39.5-0+deb12u3 \
        openssh-client=1:9.2p1-2+deb12u10 \
        python3=3.11.2-1+b1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=download /out/bin/terraform /out/bin/packer /usr/local/bin/
COPY --from=download /out/cluster-toolkit /opt/cluster-toolkit
COPY --from=download /out/google-cloud-sdk /opt/google-cloud-sdk
COPY --from=download /out/google-cloud-sdk.tar.gz.sha256 /opt/google-cloud-sdk.tar.gz.sha256
ENV PATH=/opt/google-cloud-sdk/bin:/opt/cluster-toolkit:$PATH \
    CLOUDSDK_PYTHON=/usr/bin/python3 \
    CLOUDSDK_CORE_DISABLE_PROMPTS=1 \
    CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK=1 \
    CHECKPOINT_DISABLE=1
# alpha: a flex-start TPU VM is created with `gcloud alpha compute instances create` (gcloud 528 has
# FLEX_START on its alpha track only), and the user below cannot install a component at run time
# (gcloud's component manager needs write access to the SDK: RequiresAdminRightsError).
RUN gcloud components install alpha kubectl gke-gcloud-auth-plugin --quiet \
    && rm -rf /opt/google-cloud-sdk/.install/.backup \
    && gcloud version --format=json | python3 -c 'import json,sys; assert "alpha" in json.load(sys.stdin)' \
    && terraform version \
    && packer version \
    && gcluster --version \
    && kubectl version --client --output=json \
    && gke-gcloud-auth-plugin --version \
    && git --version

RUN groupadd --gid 10001 tpu-rl \
    && useradd --uid 10001 --gid 10001 --create-home --shell /bin/bash tpu-rl
USER 10001:10001
WORKDIR /home/tpu-rl
