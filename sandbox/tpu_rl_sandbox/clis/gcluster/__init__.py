"""Fake ``gcluster`` (Cluster Toolkit v1.103.0): ``create``/``deploy``/``destroy`` and ``job``.

``python -m tpu_rl_sandbox.clis.gcluster ARGS`` (the ``<root>/bin/gcluster`` shim) runs :mod:`.app`."""
