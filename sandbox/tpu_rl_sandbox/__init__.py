"""Local sandbox: fake ``gcluster`` / ``gcloud`` CLIs backed by fake-gcs-server.

The fakes are written from the rules of the real tools (Cluster Toolkit source, gcloud's
documented syntax, the tutorials), not from this provider's renderer, so that they catch
renderer mistakes. Nothing in this package imports Airflow.

Packages, from the ground up: ``world`` (the fake cloud's state on disk), ``apis`` (the fake HTTP
APIs), ``machines`` (fake pods and VMs running real bash), ``clis`` (the fake ``gcloud`` and
``gcluster``), ``commands`` (``tpu-rl-sandbox up|down|env|demo|bench``, :mod:`tpu_rl_sandbox.cli`).

Entry points:

* :mod:`tpu_rl_sandbox.commands.lifecycle` -- ``sandbox_up`` / ``sandbox_down`` /
  ``sandbox_env`` and the ``tpu-rl-sandbox`` argparse sub-commands.
* ``python -m tpu_rl_sandbox.clis.gcluster`` and ``...clis.gcloud`` -- the fakes (normally
  reached through the shims in ``<root>/bin``).
"""
