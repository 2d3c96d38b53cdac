"""Many commands through the real Google Cloud CLI for the price of one start-up.

gcloud spends most of a short command loading itself (its Python modules and command tree: about two
CPU-seconds here). :func:`run_gcloud_commands` loads it once, as its own launcher does
(``bin/gcloud`` runs ``lib/gcloud.py`` with ``python3 -S``; ``gcloud.py`` puts ``lib/`` and
``lib/third_party`` first on ``sys.path`` and imports ``googlecloudsdk.gcloud_main``), loads each
command's group and command modules, then runs every command in a process forked from that one
(``gcloud_main.main``, the launcher's own entry point, with the command's argv): each command sees a
fresh gcloud process of its own, its exit code and its output whole, as if it had been started
alone; nothing one command does reaches another.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

# Runs with the interpreter gcloud's launcher picks, ``-S`` as the launcher passes it.
DRIVER = r"""
import gc, json, os, sys

root, commands_file, results_file = sys.argv[1:4]
sys.path.insert(0, os.path.join(root, "lib"))
import gcloud as launcher  # lib/gcloud.py: lib/ and lib/third_party first on sys.path

sys.path = launcher.reorder_sys_path(sys.path)
launcher._fix_google_module()
gcloud_main = launcher._import_gcloud_main()
cli = gcloud_main.CreateCLI([])
with open(commands_file) as handle:
    commands = json.load(handle)
top = cli._TopElement()
for argv in commands:  # each command's modules, loaded once before the forks
    words = [word for word in argv if not word.startswith("-")]
    for end in range(1, len(words) + 1):
        try:
            top.LoadSubElementByPath(words[:end])
        except Exception:
            break
gc.freeze()  # the forks' collections never walk (and copy) what gcloud loaded
results = []
for argv in commands:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        sys.argv = ["gcloud", *argv]
        code = 0
        try:
            gcloud_main.main(gcloud_cli=cli)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(write_end)
    output = b""
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        output += chunk
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    results.append([os.waitstatus_to_exitcode(status), output.decode("utf-8", "replace")])
with open(results_file, "w") as handle:
    json.dump(results, handle)
"""


def gcloud_root(gcloud: str) -> Path:
    """The Cloud SDK's root (the folder holding ``bin/gcloud`` and ``lib/gcloud.py``)."""
    return Path(gcloud).resolve().parent.parent


def launcher_python(env: Mapping[str, str]) -> str:
    """The interpreter ``bin/gcloud`` runs without ``CLOUDSDK_PYTHON``: the first ``python3`` on PATH."""
    configured = env.get("CLOUDSDK_PYTHON")
    found = configured or shutil.which("python3", path=env.get("PATH"))
    if not found:
        raise RuntimeError("no python3 on PATH for gcloud")
    return found


def run_gcloud_commands(
    gcloud: str, commands: Sequence[Sequence[str]], env: Mapping[str, str], cwd: Path, timeout: float = 600
) -> list[tuple[int, str]]:
    """Each command (gcloud's arguments, without ``gcloud``) run by the real CLI: its exit code and
    its output (stdout then stderr, interleaved as written)."""
    root = gcloud_root(gcloud)
    if not (root / "lib" / "gcloud.py").is_file():
        raise RuntimeError(f"{gcloud} is not a Cloud SDK launcher (no lib/gcloud.py under {root})")
    launched = {
        **env,
        "CLOUDSDK_ROOT_DIR": str(root),
        "CLOUDSDK_PYTHON_ARGS": "-S",
        "CLOUDSDK_ENCODING": "UTF-8",
        "PYTHONIOENCODING": "UTF-8",
    }
    launched.pop("PYTHONHOME", None)
    with tempfile.TemporaryDirectory(prefix="gcloud-batch-") as scratch:
        commands_file, results_file = Path(scratch, "commands.json"), Path(scratch, "results.json")
        commands_file.write_text(json.dumps([list(c) for c in commands]))
        done = subprocess.run(
            [launcher_python(env), "-S", "-c", DRIVER, str(root), str(commands_file), str(results_file)],
            env=launched,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0 or not results_file.is_file():
            raise RuntimeError(f"gcloud batch failed ({done.returncode}): {done.stderr[-3000:]}")
        return [(int(code), str(output)) for code, output in json.loads(results_file.read_text())]


if __name__ == "__main__":  # pragma: no cover - by hand: python -m tests.support.gcloud_batch ARGS...
    print(run_gcloud_commands(shutil.which("gcloud") or "gcloud", [sys.argv[1:]], os.environ, Path.cwd()))
