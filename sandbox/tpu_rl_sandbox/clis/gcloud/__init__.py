"""Fake ``gcloud``: the subset the provider uses, with gcloud's argument rules and messages.

``python -m tpu_rl_sandbox.clis.gcloud ARGS`` (the ``<root>/bin/gcloud`` shim) runs :mod:`.app`."""
