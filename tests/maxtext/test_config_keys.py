"""maxtext/config_keys.py is what the generator makes of the pinned MaxText releases' source.

tests/fixtures/maxtext/maxtext-vX.Y.Z/ holds those releases' src/maxtext/configs/types.py and
pyconfig.py (gzipped, byte for byte). When a pin moves (the workload image or MAXTEXT_PIP_SPEC),
these tests fail until the file is regenerated from the new release. The generator is the
developer tool tools/generate_config_keys.py (not in the wheel).
"""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.maxtext import config_keys
from airflow_provider_tpu_rl.spec.presets import (
    GKE_MAXTEXT_VERSION,
    MAXTEXT_PIP_SPEC,
    POST_TRAINING_IMAGE,
    TPU_VM_MAXTEXT_VERSION,
)
from tools import generate_config_keys
from tools.generate_config_keys import PYCONFIG_PATH, TYPES_PATH, Key, Source, key_table

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "maxtext"
GENERATED = Path(config_keys.__file__)
REGENERATE = (
    "regenerate: python tools/generate_config_keys.py "
    + " ".join(f"--source {v}=MAXTEXT_GIT_DIR@maxtext-v{v}" for v in config_keys.SOURCES)
    + " > airflow_provider_tpu_rl/maxtext/config_keys.py (and copy the two inputs to tests/fixtures/maxtext/)"
)


def _vendored(version: str) -> Source:
    folder = FIXTURES / f"maxtext-v{version}"
    recorded = config_keys.SOURCES[version]
    return Source(
        version,
        recorded.ref,
        recorded.commit,
        gzip.decompress((folder / "types.py.gz").read_bytes()).decode(),
        gzip.decompress((folder / "pyconfig.py.gz").read_bytes()).decode(),
    )


def test_the_key_lists_are_for_the_pinned_maxtext_releases() -> None:
    """GKE jobs run tpu_post_training:<v> (MaxText maxtext-v<v>); the TPU VM installs maxtext==<v>."""
    assert POST_TRAINING_IMAGE.endswith(f":{GKE_MAXTEXT_VERSION}")
    assert MAXTEXT_PIP_SPEC.endswith(f"=={TPU_VM_MAXTEXT_VERSION}")
    assert set(config_keys.SOURCES) == {GKE_MAXTEXT_VERSION, TPU_VM_MAXTEXT_VERSION}, REGENERATE
    for version, source in config_keys.SOURCES.items():
        assert source.ref == f"maxtext-v{version}", REGENERATE
        assert len(source.commit) == 40


@pytest.mark.parametrize("version", sorted(config_keys.SOURCES))
def test_the_vendored_inputs_are_the_ones_the_file_was_generated_from(version: str) -> None:
    source = _vendored(version)
    recorded = dict(config_keys.SOURCES[version].files)
    assert recorded == {
        TYPES_PATH: hashlib.sha256(source.types_py.encode()).hexdigest(),
        PYCONFIG_PATH: hashlib.sha256(source.pyconfig_py.encode()).hexdigest(),
    }, REGENERATE


def test_config_keys_py_is_what_the_generator_writes() -> None:
    sources = [_vendored(version) for version in config_keys.SOURCES]
    assert generate_config_keys.render(sources) == GENERATED.read_text(), REGENERATE


def _entries(version: str) -> int:
    return len(config_keys.KEYS[version]) + sum(map(len, config_keys.NESTED[version].values()))


def test_the_newest_version_is_in_full_and_the_older_one_its_difference() -> None:
    text = GENERATED.read_text()
    newest, *older = sorted(config_keys.SOURCES, key=generate_config_keys._version_key, reverse=True)
    assert older, "two pinned versions"
    ident = newest.replace(".", "_")
    assert f"_KEYS_{ident}: Final[dict[str, ConfigKey]] = {{" in text
    for version in older:
        derived = (
            f"_KEYS_{version.replace('.', '_')}: Final[dict[str, ConfigKey]] = _derive(\n    _KEYS_{ident},"
        )
        assert derived in text
    # two full tables would write every entry of both; the difference writes far fewer
    assert text.count('K("') < _entries(newest) + sum(_entries(version) for version in older) / 2


def _as_config_keys(keys: Mapping[str, Key]) -> dict[str, config_keys.ConfigKey]:
    return {
        name: config_keys.ConfigKey(key.kind, key.nullable, key.choices, **key.bounds)
        for name, key in keys.items()
    }


@pytest.mark.parametrize("version", sorted(config_keys.SOURCES))
def test_each_version_looks_up_the_keys_its_source_defines(version: str) -> None:
    """The difference applied to the newest table gives exactly the older version's own table."""
    table = key_table(_vendored(version))
    assert table.config_class == config_keys.SOURCES[version].config_class
    assert config_keys.KEYS[version] == _as_config_keys(table.keys)
    assert config_keys.NESTED[version] == {
        model: _as_config_keys(sub_keys) for model, sub_keys in table.nested.items()
    }


def test_the_older_version_differs_where_maxtext_changed() -> None:
    """Spot checks of the 0.2.3 difference: a key it lacks, one only it has, one it types differently."""
    newer, older = config_keys.KEYS[GKE_MAXTEXT_VERSION], config_keys.KEYS[TPU_VM_MAXTEXT_VERSION]
    assert "inference_rollouts" in newer
    assert "inference_rollouts" not in older
    assert "dpo" in older
    assert "dpo" not in newer
    assert newer["num_batches"] != older["num_batches"]
    assert set(config_keys.NESTED[GKE_MAXTEXT_VERSION]) != set(config_keys.NESTED[TPU_VM_MAXTEXT_VERSION])


def test_a_difference_that_does_not_fit_its_base_is_refused() -> None:
    base = {"a": config_keys.ConfigKey("int")}
    derive = config_keys._derive
    assert derive(base, added={"b": config_keys.ConfigKey("str")}, changed={}, removed=("a",)) == {
        "b": config_keys.ConfigKey("str")
    }
    with pytest.raises(ValueError, match="unknown"):
        derive(base, added={}, changed={"z": config_keys.ConfigKey("int")}, removed=())
    with pytest.raises(ValueError, match="unknown"):
        derive(base, added={}, changed={}, removed=("z",))
    with pytest.raises(ValueError, match="already present"):
        derive(base, added={"a": config_keys.ConfigKey("str")}, changed={}, removed=())


def test_the_generator_writes_the_newest_in_full_whatever_the_order_given() -> None:
    sources = [_vendored(version) for version in config_keys.SOURCES]
    assert generate_config_keys.render(list(reversed(sources))) == generate_config_keys.render(sources)


def test_the_generator_runs_as_a_script_from_the_repository_root() -> None:
    for command in (["tools/generate_config_keys.py"], ["-m", "tools.generate_config_keys"]):
        done = subprocess.run(
            [sys.executable, *command, "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "--source" in done.stdout


def test_the_command_line_reads_a_checkout_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv: list[str] = []
    for version in config_keys.SOURCES:
        source = _vendored(version)
        root = tmp_path / version
        for path, text in ((TYPES_PATH, source.types_py), (PYCONFIG_PATH, source.pyconfig_py)):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        argv += ["--source", f"{version}={root}", "--commit", f"{version}={source.commit}"]
    assert generate_config_keys.main(argv) == 0
    assert capsys.readouterr().out == GENERATED.read_text()


def test_what_the_generator_reads_from_a_model() -> None:
    """Inheritance, optional values, literals, enums, nested models, Field bounds, aliases."""
    types_py = textwrap.dedent(
        """
        from enum import Enum
        from typing import Literal, NewType, Optional
        from pydantic import BaseModel, Field
        from pydantic.types import PositiveInt

        PathStr = NewType("PathStr", str)

        class DType(str, Enum):
          BF16 = "bfloat16"
          F32 = "float32"

        class Base(BaseModel):
          lr: float = Field(1.0, gt=0.0, le=1.0)
          steps: PositiveInt = 1
          path: PathStr = ""

        class Inner(BaseModel):
          k: int = 2
          algo: Literal["grpo", "gspo-token"] = "grpo"

        class RLConfig(Base):
          dtype: DType = DType.BF16
          seqs: Optional[int] = None
          words: None | list[str] = None
          extra: dict[str, int] = Field(default_factory=dict)
          either: int | str = 0
          rl: Inner = Field(default_factory=Inner)
        """
    )
    table = key_table(
        Source("9.9.9", "maxtext-v9.9.9", "0" * 40, types_py, "def _check_for_invalid_keys(): ...")
    )
    keys = {name: key.render() for name, key in table.keys.items()}
    assert table.config_class == "RLConfig"
    assert keys == {
        "lr": 'K("float", gt=0.0, le=1.0)',
        "steps": 'K("int", gt=0)',
        "path": 'K("str")',
        "dtype": 'K("str", choices=("bfloat16", "float32"))',
        "seqs": 'K("int", nullable=True)',
        "words": 'K("list", nullable=True)',
        "extra": 'K("dict")',
        "either": 'K("any")',
        "rl": 'K("model")',
        # _check_for_invalid_keys: a nested model's fields are keys too
        "k": 'K("int")',
        "algo": 'K("str", choices=("grpo", "gspo-token"))',
    }
    assert {name: key.render() for name, key in table.nested["rl"].items()} == {
        "k": 'K("int")',
        "algo": 'K("str", choices=("grpo", "gspo-token"))',
    }
    # Without that lookup (maxtext-v0.2.3) only the top-level fields are keys.
    older = key_table(Source("9.9.8", "maxtext-v9.9.8", "0" * 40, types_py, ""))
    assert "k" not in older.keys
    assert "rl" in older.keys
