# syntax=docker/dockerfile:1
# Airflow 3.3 + this provider + the sandbox distribution (fake gcluster/gcloud, fake-gcs-server
# from its PyPI wheel, the fake GCP API): the image of every service of docker/compose.yaml.
# For local trials only; it holds no real toolchain and talks to no cloud.
#
# Build: docker compose -f docker/compose.yaml build   (or: docker build -f docker/sandbox.Dockerfile .)
ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11
FROM ${AIRFLOW_IMAGE}
ARG AIRFLOW_VERSION=3.3.2

COPY --chown=airflow:root docker/constraints-3.11.txt /opt/tpu-rl/constraints.txt
COPY --chown=airflow:root pyproject.toml README.md /opt/tpu-rl/src/
COPY --chown=airflow:root airflow_provider_tpu_rl /opt/tpu-rl/src/airflow_provider_tpu_rl
COPY --chown=airflow:root sandbox /opt/tpu-rl/sandbox
RUN pip install --no-cache-dir -c /opt/tpu-rl/constraints.txt \
        "apache-airflow==${AIRFLOW_VERSION}" "/opt/tpu-rl/src[postgres]" /opt/tpu-rl/sandbox
COPY --chown=airflow:root dags/ /opt/airflow/dags/
COPY docker/sandbox-entrypoint.sh /opt/tpu-rl/sandbox-entrypoint.sh

# The fake pods and TPU VM run the rendered scripts in their own mount/PID namespaces (`unshare`,
# README "The sandbox"), which needs root in a privileged container. The packages above were
# installed for the airflow user; PYTHONUSERBASE lets root import them too.
ENV PYTHONUSERBASE=/home/airflow/.local \
    TPU_RL_SANDBOX_DIR=/sandbox
# hadolint ignore=DL3002
USER 0
ENTRYPOINT ["/usr/bin/dumb-init", "--", "/opt/tpu-rl/sandbox-entrypoint.sh"]
