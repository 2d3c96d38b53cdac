"""``python -m tpu_rl_sandbox.clis.gcloud ARGS``: the fake ``gcloud``."""

import sys

from tpu_rl_sandbox.clis.gcloud.dispatch import main

sys.exit(main())
