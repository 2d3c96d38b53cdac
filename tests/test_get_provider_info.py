"""The provider's metadata (get_provider_info.py): valid against Airflow's own schema, and every module
and extra link it names imports."""

from __future__ import annotations

from airflow_provider_tpu_rl.get_provider_info import get_provider_info


def test_provider_info_follows_airflows_schema() -> None:
    import json
    from pathlib import Path

    import airflow
    import jsonschema

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)
    assert "airflow_provider_tpu_rl.operators.ledger" in get_provider_info()["operators"][0]["python-modules"]


def test_every_module_the_provider_lists_imports() -> None:
    import importlib

    info = get_provider_info()
    modules = [
        module
        for kind in ("hooks", "operators", "sensors", "triggers")
        for entry in info[kind]
        for module in entry["python-modules"]
    ]
    for module in modules:
        importlib.import_module(module)
    for link in info["extra-links"]:
        module, _, name = link.rpartition(".")
        assert hasattr(importlib.import_module(module), name), link
