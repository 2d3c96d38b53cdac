"""``python -m tpu_rl_sandbox.clis.gcloud ARGS``: the fake ``gcloud``."""

import random
import sys

from tpu_rl_sandbox.clis.gcloud.app import main

random.seed()
sys.exit(main())
