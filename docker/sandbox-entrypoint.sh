#!/bin/bash
# Entry point of the docker/compose.yaml services (docker/sandbox.Dockerfile).
#   sandbox-entrypoint.sh sandbox        start the sandbox in $TPU_RL_SANDBOX_DIR (fake-gcs-server, the
#                                        fake GCP API, the fake CLIs), write its environment to
#                                        $TPU_RL_SANDBOX_DIR/compose.env and wait; stop it on TERM/INT
#   sandbox-entrypoint.sh COMMAND ARGS   wait (up to $TPU_RL_SANDBOX_WAIT_SECONDS, default 180) for
#                                        compose.env, load it, exec COMMAND (airflow ...)
# The Airflow services share the sandbox service's network and PID namespaces (compose.yaml), so
# the emulator and API addresses (127.0.0.1) and the process ids recorded in the sandbox folder
# mean the same in every container.
set -euo pipefail
root=${TPU_RL_SANDBOX_DIR:-/sandbox}
env_file="$root/compose.env"

if [ "${1:-}" = "sandbox" ]; then
  sleeper=""
  stop() {
    rm -f "$env_file"
    if [ -n "$sleeper" ]; then kill "$sleeper" 2>/dev/null || true; fi
    tpu-rl-sandbox down --dir "$root"
    exit 0
  }
  trap stop TERM INT
  rm -f "$env_file"
  tpu-rl-sandbox up --dir "$root"
  tpu-rl-sandbox env --dir "$root" > "$env_file.partial"
  mv "$env_file.partial" "$env_file"
  echo "sandbox-entrypoint: sandbox ready, environment in $env_file"
  while true; do
    sleep 3600 &
    sleeper=$!
    wait "$sleeper" || true
  done
fi

wait_seconds=${TPU_RL_SANDBOX_WAIT_SECONDS:-180}
for _ in $(seq 1 "$wait_seconds"); do
  [ -s "$env_file" ] && break
  sleep 1
done
if [ ! -s "$env_file" ]; then
  echo "sandbox-entrypoint: no $env_file after ${wait_seconds}s; is the fake-gcs-server service running?" >&2
  exit 1
fi
# shellcheck source=/dev/null
. "$env_file"
exec "$@"
