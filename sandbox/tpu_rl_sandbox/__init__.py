"""Local sandbox: fake ``gcluster`` / ``gcloud`` CLIs backed by fake-gcs-server.

The fakes are written from the rules of the real tools (Cluster Toolkit source, gcloud's
documented syntax, the tutorials), not from this provider's renderer, so that they catch
renderer mistakes. Nothing in this package imports Airflow.

Entry points:

* :mod:`tpu_rl_sandbox.control` -- ``sandbox_up`` / ``sandbox_down`` /
  ``sandbox_env`` and the ``tpu-rl-sandbox`` argparse sub-commands.
* ``python -m tpu_rl_sandbox.fake_gcluster`` and ``...fake_gcloud`` -- the
  fakes (normally reached through the shims in ``<root>/bin``).
"""
