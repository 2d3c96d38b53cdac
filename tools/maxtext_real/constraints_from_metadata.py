"""Write the versions MaxText's TPU VM install resolves to, as a uv constraints file.

The TPU VM runs ``UV_TORCH_BACKEND=cpu uv pip install 'maxtext[tpu-post-train]==X' --resolution=lowest``
(render/tpu_vm.py install_script). The extra lists its whole dependency closure with ``>=`` lower
bounds, so ``--resolution=lowest`` installs exactly those bounds. This script turns each
``Requires-Dist: name>=v; extra == 'tpu-post-train'`` of the installed maxtext's METADATA into
``name==v`` (keeping other markers), so a subset installed with ``-c`` gets the same versions.
``torch==2.11.0+cpu`` (the PyTorch index's local version, unreachable here) becomes ``torch==2.11.0``.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import distribution

EXTRA = "tpu-post-train"
_EXTRA_MARKER = re.compile(rf"(?:\s*and\s*)?extra\s*==\s*'{re.escape(EXTRA)}'")


def constraints(dist_name: str = "maxtext") -> list[str]:
    lines = []
    for req in distribution(dist_name).requires or []:
        if f"extra == '{EXTRA}'" not in req:
            continue
        spec, _, marker = req.partition(";")
        marker = _EXTRA_MARKER.sub("", marker).strip()
        marker = re.sub(r"^\((.*)\)$", r"\1", marker).strip()
        spec = spec.strip().replace(">=", "==")
        spec = re.sub(r"\+cpu$", "", spec)
        if spec.startswith("torchvision"):
            continue  # not needed by the converters
        lines.append(f"{spec}; {marker}" if marker else spec)
    return lines


if __name__ == "__main__":
    sys.stdout.write("\n".join(constraints()) + "\n")
