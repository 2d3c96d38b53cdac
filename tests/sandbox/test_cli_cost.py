"""``tpu-rl-sandbox bench`` section 6 (``commands/cli_cost.py``): each command run through its shim,
its exit code and the modules it imports; the table it prints. It asserts no duration."""

from __future__ import annotations

import os
import sys

from tpu_rl_sandbox.commands.cli_cost import FAKE_COMMANDS, CallCost, cost_lines, measure
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo


def test_each_command_is_run_the_times_asked_through_its_shim(sandbox: SandboxInfo) -> None:
    env = {**os.environ, **sandbox.env}
    commands = [
        ("gcloud version", (str(sandbox.bin_dir / "gcloud"), "version")),
        ("gcloud bad flag", (str(sandbox.bin_dir / "gcloud"), "storage", "ls", "--no-such-flag")),
        ("kubectl stub", (str(sandbox.bin_dir / "kubectl"), "version", "--client")),
        ("floor", (sys.executable, "-S", "-c", "pass")),
    ]
    costs = {cost.label: cost for cost in measure(commands, env, calls=2)}
    assert [len(cost.cpu_ms) for cost in costs.values()] == [2, 2, 2, 2]
    assert [cost.exit_code for cost in costs.values()] == [0, 2, 0, 0]
    modules = costs["gcloud version"].modules
    assert modules is not None
    assert modules > 0
    assert costs["kubectl stub"].modules is None  # a shell script imports nothing


def test_the_typical_commands_name_tools_the_sandbox_has(sandbox: SandboxInfo) -> None:
    assert {argv[0] for _, argv in FAKE_COMMANDS} <= {path.name for path in sandbox.bin_dir.iterdir()}


def test_the_table_has_a_line_per_command_with_its_median() -> None:
    costs = [
        CallCost("gcloud version", [30.0, 10.0, 20.0], [1.0, 2.0, 3.0], 0, 100),
        CallCost("kubectl", [1.0], [1.0], 0, None),
    ]
    lines = cost_lines(costs, 3)
    assert lines[0].startswith("7. Fake CLI calls: CPU per call, median of 3")
    assert lines[2].split() == ["gcloud", "version", "20.0", "2.0", "0", "100"]
    assert lines[3].split() == ["kubectl", "1.0", "1.0", "0", "-"]
