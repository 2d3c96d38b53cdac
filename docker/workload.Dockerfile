# syntax=docker/dockerfile:1
# The tutorials' workload image with their two start-up patches applied at build time: the tunix
# reshard chunk size fixed to 4 and MaxText's RL optimizer switched from AdamW to Adafactor.
# docker/workload_patches.py fails the build when either no longer matches exactly once.
# Use it with `image=<where you pushed it>` and `workload_image_patched=true`: the train command
# then starts MaxText without rewriting installed files (see README, "The workload image").
#
# Build (context = repository root) and push to your Artifact Registry:
#   docker build -f docker/workload.Dockerfile \
#     -t us-docker.pkg.dev/PROJECT/REPO/tpu_post_training:0.2.4-tpu-rl .
#   docker push us-docker.pkg.dev/PROJECT/REPO/tpu_post_training:0.2.4-tpu-rl
#
# The base is the tag the tutorials and airflow_provider_tpu_rl/spec/presets.py
# (POST_TRAINING_IMAGE) use; tests/docker checks the two agree. Its digest is not pinned here
# (not knowable offline): pin it with --build-arg POST_TRAINING_IMAGE=...@sha256:<digest>.
ARG POST_TRAINING_IMAGE=us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4
FROM ${POST_TRAINING_IMAGE}

COPY docker/workload_patches.py /opt/tpu-rl/workload_patches.py
RUN python3 /opt/tpu-rl/workload_patches.py

LABEL org.opencontainers.image.title="tpu_post_training 0.2.4, patched for airflow-provider-tpu-rl" \
      io.github.tpu-rl.patches="tunix-reshard-chunk-size-4,maxtext-rl-adafactor"
