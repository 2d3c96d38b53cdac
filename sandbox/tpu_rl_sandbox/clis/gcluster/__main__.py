"""``python -m tpu_rl_sandbox.clis.gcluster ARGS``: the fake ``gcluster``."""

import sys

from tpu_rl_sandbox.clis.gcluster.app import main

sys.exit(main())
