# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONSTRAINTS := docker/constraints-3.11.txt
# The test matrix's other two lines: Airflow 2.11.2 with the same providers, and Airflow 2.11.2 with
# the lowest provider versions pyproject.toml allows (what an older Cloud Composer image has).
VENV_211 := .venv-211
VENV_LOWEST := .venv-lowest
export PATH := $(CURDIR)/$(BIN):$(PATH)
# Python keeps the modules it compiles in __pycache__ (git-ignored) even where the environment
# asks it not to: without that cache every Airflow process a target starts (a `dags test`, a
# pytest worker, a real scheduler) compiles its ~4,500 imported modules again, 10 s of CPU each.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv postgres chromium inotify-tools test test-maxtext test-side-unit test-side-others test-all lint typecheck unit unit-airflow unit-airflow-free test-airflow-2.11 test-lowest demo plan bench screenshots clean
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml sandbox/pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "uv==0.13.9"
	$(BIN)/uv pip install -q --python $(BIN)/python -c $(CONSTRAINTS) -e '.[dev]' -e ./sandbox
	touch $@

# One venv per pinned set: $(call pinned_venv,<venv dir>,<constraints file>)
define pinned_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q "uv==0.13.9"
	$(1)/bin/uv pip install -q --python $(1)/bin/python -c $(2) -e '.[dev]' -e ./sandbox
	touch $(1)/.installed
endef

$(VENV_211)/.installed: pyproject.toml sandbox/pyproject.toml docker/constraints-airflow-2.11-3.11.txt
	$(call pinned_venv,$(VENV_211),docker/constraints-airflow-2.11-3.11.txt)

$(VENV_LOWEST)/.installed: pyproject.toml sandbox/pyproject.toml docker/constraints-lowest-3.11.txt
	$(call pinned_venv,$(VENV_LOWEST),docker/constraints-lowest-3.11.txt)

# The ledger tests run against a real PostgreSQL server (Debian's package), started per test session.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends postgresql; }

# The browser test drives the Airflow UI with Debian's Chromium (Playwright, from the dev extra,
# launches /usr/bin/chromium; it never downloads a browser).
chromium:
	@ls /usr/bin/chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium; }

# The real-converter leg watches MaxText write with inotify (inotifywait, Debian's inotify-tools).
inotify-tools:
	@command -v inotifywait >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends inotify-tools; }

lint: venv
	$(call timed,lint,$(BIN)/ruff check airflow_provider_tpu_rl sandbox dags tests tools docs/examples \
	  && $(BIN)/ruff format --check airflow_provider_tpu_rl sandbox dags tests tools docs/examples \
	  && $(BIN)/sqlfluff lint sql/)

typecheck: venv
	$(call timed,typecheck,$(BIN)/mypy)

# pytest-xdist: each leg spreads its test files over WORKERS processes (--dist loadfile keeps a
# file's module-scoped sandbox world on one worker), the longest files first (tests/conftest.py;
# --no-loadscope-reorder keeps that order). Most tests wait on subprocesses, the emulator or a
# poll, so a leg keeps more workers than this machine has cores busy.
WORKERS ?= 3
# --durations=10: every pytest session ends with its ten slowest tests (setup, call or teardown), and
# with its ten costliest test files in CPU-seconds (tests/support/cpu_profile.py).
PYTEST_ARGS := -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=10

# `make test` prints each leg's wall time and CPU-seconds at its end, and all of them once both sides are done:
# $(call timed,<leg name>,<command>) runs the command, appends "<leg>: N s wall, C CPU-s (exit E)"
# to $(LEG_TIMES) and prints it, and fails as the command did. C is the user + system CPU time of
# every process the leg started and waited for (the recipe shell's cutime + cstime in /proc; a
# process left to init, such as a sandbox's emulator, is not in it): on this 2-core machine the
# suite is CPU-bound, so C is what a change costs whatever else runs, while the wall time moves
# with the load.
LEG_TIMES := .test-leg-times
define timed
	@start=$$(date +%s); status=0; $(2) || status=$$?; \
	  cpu=$$(awk -v tick=$$(getconf CLK_TCK) '{ printf "%d", ($$16 + $$17) / tick }' /proc/$$$$/stat); \
	  line="$(1): $$(( $$(date +%s) - start )) s wall, $$cpu CPU-s (exit $$status)"; \
	  echo "== $$line"; echo "$$line" >> $(LEG_TIMES); exit $$status
endef

# Tests of code that imports no Airflow and no provider package (the pure spec, renderer and MaxText
# tables, the golden tutorial commands, the sandbox's fakes, the Docker files): another Airflow line
# or provider version runs the same code, so they run in `unit` only.
AIRFLOW_FREE_TESTS := tests/spec tests/render tests/golden tests/maxtext tests/sql tests/sandbox tests/docker

# Tests no Airflow line changes that run on the Airflow 2.11 leg instead of the 3.3 leg: the lease race
# between two runs and two runs at once on a cluster a platform team runs (each two `airflow dags test`
# of the GKE pipeline at once, cheaper on 2.11) and five
# operator modules that call execute() with a plain-dict context against the sandbox (run identity,
# the run directory's takeover, the TPU VM operators, preflight's own checks, the IAM grants' release:
# about five worker-minutes), so the two sides of `make test` end together (the 3.3 leg ended
# 1.7 minutes after the other side with only the first three here).
# `make test-all` runs them on 3.3 as well.
ON_AIRFLOW_2_11_ONLY := tests/e2e/test_cluster_lease.py tests/e2e/test_existing_cluster_runs.py \
	tests/operators/test_run_identity.py tests/operators/test_preflight.py tests/operators/test_iam_grants.py \
	tests/operators/test_run_dir_takeover.py tests/operators/test_tpu_vm.py

# The whole suite on Airflow 3.3 (but ON_AIRFLOW_2_11_ONLY); `make test` runs it in two parts, one on each side.
unit: venv postgres chromium
	$(call timed,unit (Airflow 3.3),$(BIN)/pytest $(PYTEST_ARGS) $(addprefix --ignore=,$(ON_AIRFLOW_2_11_ONLY)))

unit-airflow: venv postgres chromium
	$(BIN)/pytest $(PYTEST_ARGS) $(addprefix --ignore=,$(AIRFLOW_FREE_TESTS))

unit-airflow-free: venv
	$(BIN)/pytest $(PYTEST_ARGS) $(AIRFLOW_FREE_TESTS)

# Tests that use Airflow but whose behaviour no Airflow line changes: the operator tests that call
# execute() with a plain-dict context and check the provider's own logic against the sandbox (the
# TPU VM run directory's takeover and a retry following its container (both run a task in a thread,
# which Airflow 2's ExecutorSafeguard refuses), shared buckets, cleanup, the cluster's lifecycle,
# the job operators' failure handling, metrics, the JobSet trigger's recovery without its cancel
# path, a run's own pools and preflight on a GKE cluster it does not own, preemption on both
# runners, the TPU VM's billed spans and the admission bound; run identity, the GKE takeover, the
# TPU VM operators, preflight's own checks (its paths through the providers,
# tests/operators/test_preflight_providers.py, run on every line) and the IAM grants' release run
# on 2.11 instead:
# ON_AIRFLOW_2_11_ONLY), the sweep example (the same operators in a hand-written DAG), the Airflow CLI server the
# end-to-end runs go through (they use it on both lines), `tpu-rl doctor` (tools, gcloud and ADC; its connection lookup is
# the hooks' own, tested on 2.11), the wheel's contents (built from the sources alone) and the test
# file each module has (a file listing). On Airflow 2.11 the pipelines' end-to-end runs drive
# every operator through real tasks, tests/operators/test_templating.py
# renders every argument, and the JobSet trigger, janitor and preflight tests run there too;
# tests/test_airflow_free.py checks that none of these files branches on the Airflow version and
# that every module that does is tested on 2.11. `make test-all` runs them on 2.11 as well.
SAME_ON_EVERY_AIRFLOW := tests/operators/test_bucket_sharing.py tests/operators/test_ensure_bucket.py tests/triggers/test_jobset_recovery.py tests/operators/test_first_real_run.py \
	tests/operators/test_gke_jobs.py tests/operators/test_gke.py \
	tests/operators/test_hygiene.py \
	tests/operators/test_run_dir_takeover_vm.py tests/operators/test_takeover.py \
	tests/operators/test_tpu_vm_container_retry.py \
	tests/operators/test_tpu_vm_capacity.py tests/operators/test_training_metrics.py \
	tests/operators/test_boot_image.py \
	tests/operators/test_existing_cluster.py tests/operators/test_preflight_existing_cluster.py \
	tests/operators/test_preemption.py tests/operators/test_tpu_vm_preemption.py \
	tests/operators/test_billing.py tests/operators/test_admission_timeout.py \
	tests/e2e/test_sweep_example.py tests/e2e/test_airflow_server.py tests/test_doctor.py tests/test_wheel.py \
	tests/docs/test_module_map.py tests/test_waiting.py

# Every other test that runs Airflow or the providers, again on Airflow 2.11.2, the end-to-end runs
# and the real services included (lint and types run once).
test-airflow-2.11: $(VENV_211)/.installed postgres chromium
	$(call timed,test-airflow-2.11,PATH=$(CURDIR)/$(VENV_211)/bin:$$PATH $(VENV_211)/bin/pytest $(PYTEST_ARGS) \
	  $(addprefix --ignore=,$(AIRFLOW_FREE_TESTS) $(SAME_ON_EVERY_AIRFLOW)))

# The lowest provider versions: the tests of the code that calls the providers. The hooks, the tool
# runtime, the bucket's records, sensors, triggers (but the JobSet trigger's recovery, which no
# provider version changes), ledger, the provider's errors and compat fallbacks, and the operator
# tests of the modules that call a provider themselves (the JobSet client, the janitor's GCSHook,
# record_run's upload, the links and the provider's metadata, preflight's paths through the providers (its TimeDeltaTrigger, the permission client, the lease's GCS hook), the
# operators' connection-project default; the OpenLineage facets against the lowest OpenLineage
# provider, and the asset events on Airflow 2.11's datasets; tests/test_airflow_free.py checks the list). Every operator
# and trigger test module is collected there, and the sandbox demo runs both pipelines through every
# operator; the other operator tests reach the providers only through the hooks tested here, and run
# on 3.3 and 2.11.
LOWEST_TESTS := tests/hooks tests/toolchain tests/records tests/sensors tests/ledger tests/test_compat.py \
	tests/triggers/test_gcs_checkpoint.py tests/triggers/test_gcs_checkpoint_on_emulator.py tests/triggers/test_jobset.py \
	tests/operators/test_run_identity_kube_patch.py tests/operators/test_janitor_orphans.py tests/operators/test_janitor.py \
	tests/operators/test_deploy_cluster_link.py tests/operators/test_preflight_providers.py tests/operators/test_base.py \
	tests/operators/test_ledger.py tests/test_links.py tests/test_get_provider_info.py tests/test_exceptions.py \
	tests/test_lineage.py tests/test_assets.py
LOWEST_PATH := PATH=$(CURDIR)/$(VENV_LOWEST)/bin:$$PATH
test-lowest: $(VENV_LOWEST)/.installed postgres
	$(call timed,test-lowest,$(LOWEST_PATH) $(VENV_LOWEST)/bin/pytest $(PYTEST_ARGS) $(LOWEST_TESTS) \
	  && $(LOWEST_PATH) $(VENV_LOWEST)/bin/pytest -qq --collect-only tests/operators tests/triggers \
	  && $(LOWEST_PATH) $(VENV_LOWEST)/bin/tpu-rl-sandbox demo --dir .sandbox-lowest --airflow-home .demo-lowest/airflow)

# Before the legs start, while the machine is quiet, tools/machine_speed.py times a fixed pure-Python
# workload; the summary repeats it, since the legs' CPU-seconds compare only at the same speed (the
# same commit took 1973 CPU-s of the legs on one session's machine and 3246 on another's).
# Two sides at once: the whole Airflow 3.3 leg (`unit`, one pytest session: its short Airflow-free
# files fill its workers' tails) on one; lint, types, the Airflow 2.11 leg and the lowest-providers
# leg one after another on the other, so both sides take about as long. (Left to itself, make -j2 started
# the 3.3 leg last.) The 2.11 and lowest-providers venvs are built on the second side, beside the
# 3.3 leg, not before both. Each target's output is printed whole when it ends; every target runs even if
# another fails, and make test fails if any did.
SIDE_B := lint typecheck test-airflow-2.11 test-lowest
test: venv postgres chromium
	@echo "make test: the suite on Airflow 3.3 (unit) beside lint, typecheck, the suite on Airflow 2.11 (test-airflow-2.11) and on the lowest providers (test-lowest); each one's output appears when it ends"
	@rm -f $(LEG_TIMES); speed=$$($(BIN)/python tools/machine_speed.py); echo "$$speed"; start=$$(date +%s); status=0; \
	  $(MAKE) --no-print-directory --jobs=2 --keep-going --output-sync=target test-side-unit test-side-others || status=$$?; \
	  echo "== make test: each leg's wall time and CPU-seconds (the two sides ran at once; the 2.11 and lowest venvs are built before their legs)"; \
	  cat $(LEG_TIMES) 2>/dev/null; echo "$$speed"; \
	  echo "both sides: $$(( $$(date +%s) - start )) s wall, $$(awk -F', ' '{ sum += $$2 } END { printf "%d", sum }' $(LEG_TIMES) 2>/dev/null) CPU-s of the legs (exit $$status)"; \
	  exit $$status

test-side-unit:
	@$(MAKE) --no-print-directory unit

test-side-others:
	@status=0; for target in $(SIDE_B); do $(MAKE) --no-print-directory $$target || status=$$?; done; exit $$status

# `make test`, then the tests it runs on Airflow 3.3 only because no Airflow line changes what they
# check (SAME_ON_EVERY_AIRFLOW) on Airflow 2.11 too.
test-all: test $(VENV_211)/.installed postgres chromium
	PATH=$(CURDIR)/$(VENV_211)/bin:$$PATH $(VENV_211)/bin/pytest $(PYTEST_ARGS) $(SAME_ON_EVERY_AIRFLOW)
	$(BIN)/pytest $(PYTEST_ARGS) $(ON_AIRFLOW_2_11_ONLY)

# MaxText's own to_maxtext and to_huggingface on CPU, with the keys the pipelines render, judged by the
# provider's layout rules (tests/maxtext_real; about 5 minutes here, not part of `make test`; .ci/run
# runs it after). One venv per MaxText release the pipelines run (tools/maxtext_real/pipelines.py reads
# it from the provider's spec: 0.2.4, one release per run), built from PyPI on Python 3.12 from pyenv by
# tools/maxtext_real/setup.sh into .venv-maxtext-<release>/ (~5 GB, hard-linked from uv's cache; a
# stamp makes a re-run a no-op). MAXTEXT_REAL_REFRESH=1 rewrites tests/fixtures/maxtext/real_layouts.json.
test-maxtext: venv inotify-tools
	@for release in $$($(BIN)/python -m tools.maxtext_real.pipelines); do \
	  UV=$(CURDIR)/$(BIN)/uv bash tools/maxtext_real/setup.sh $$release .venv-maxtext-$$release || exit 1; \
	done
	TPU_RL_MAXTEXT_LEG=1 $(BIN)/pytest -q -rs tests/maxtext_real

plan: venv
	$(BIN)/tpu-rl plan tpu_rl_gke_pipeline

# The whole multi-host pipeline in the local sandbox (no cloud). Run it twice: the second run
# finds the converted checkpoint and skips conversion.
demo: venv
	$(BIN)/tpu-rl-sandbox demo

# Benchmarks (not tests): parse time vs stock operators, orchestration overhead, worker-slot time,
# TPU time and cost, the capacity fallback (5.), an existing cluster beside a created one (6., --existing-only), the fake CLIs' CPU per call (7., --cli-cost-only). BENCH_ARGS passes options on, e.g. make bench BENCH_ARGS="--tpu-time-only
# --stage-minutes '{\"train\": 60}'" (tpu-rl-sandbox bench --help).
BENCH_ARGS ?=
bench: venv
	$(BIN)/tpu-rl-sandbox bench $(BENCH_ARGS)

# The docs' screenshots (docs/screenshots/: both trigger forms, the runs dashboard, a run page),
# taken again after a change: the Chromium session of tests/services/test_browser_trigger.py with
# TPU_RL_SCREENSHOTS set, on the real services (Airflow 3.3). Not part of `make test`.
SCREENSHOT_DIR := docs/screenshots
screenshots: venv postgres chromium
	TPU_RL_SCREENSHOTS=$(CURDIR)/$(SCREENSHOT_DIR) $(BIN)/pytest -q tests/services/test_browser_trigger.py

clean:
	rm -rf $(LEG_TIMES) $(VENV) $(VENV_211) $(VENV_LOWEST) .venv-maxtext-* .sandbox .demo .sandbox-211 .demo-211 .sandbox-lowest .demo-lowest .airflow
