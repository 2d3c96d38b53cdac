"""maxtext/config_keys.py is what the generator makes of the pinned MaxText releases' source.

tests/fixtures/maxtext/maxtext-vX.Y.Z/ holds those releases' src/maxtext/configs/types.py and
pyconfig.py (gzipped, byte for byte). When a pin moves (the workload image or MAXTEXT_PIP_SPEC),
these tests fail until the file is regenerated from the new release.
"""

from __future__ import annotations

import gzip
import hashlib
import textwrap
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.maxtext import config_keys, generate_config_keys
from airflow_provider_tpu_rl.maxtext.generate_config_keys import PYCONFIG_PATH, TYPES_PATH, Source, key_table
from airflow_provider_tpu_rl.spec.presets import (
    GKE_MAXTEXT_VERSION,
    MAXTEXT_PIP_SPEC,
    POST_TRAINING_IMAGE,
    TPU_VM_MAXTEXT_VERSION,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "maxtext"
GENERATED = Path(config_keys.__file__)
REGENERATE = (
    "regenerate: python -m airflow_provider_tpu_rl.maxtext.generate_config_keys "
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
