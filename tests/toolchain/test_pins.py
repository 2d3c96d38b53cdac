"""The Terraform and Packer releases gcluster checks for (toolchain/pins.py), as the toolchain installs
and verifies them: cluster-toolkit's own versions and checksums."""

from __future__ import annotations

import re

from airflow_provider_tpu_rl.hooks.connection_fields import GCLUSTER_CONN_FIELDS, GCLUSTER_UI_FIELD_BEHAVIOUR
from airflow_provider_tpu_rl.toolchain import pins
from airflow_provider_tpu_rl.toolchain import tools as tc


def test_pins_come_from_the_cluster_toolkit_source() -> None:
    assert (tc.TERRAFORM_VERSION, tc.PACKER_VERSION) == ("1.12.2", "1.15.0")
    assert (
        tc.TERRAFORM_SHA256["linux_amd64"]
        == "1eaed12ca41fcfe094da3d76a7e9aa0639ad3409c43be0103ee9f5a1ff4b7437"
    )
    assert (
        tc.PACKER_SHA256["linux_amd64"] == "2fd1149c5c6c7604ced64d7b56638af05f6b7ed3f6835182bc913ddaba1f16b8"
    )
    assert (
        set(tc.TERRAFORM_SHA256)
        == set(tc.PACKER_SHA256)
        == {
            "linux_amd64",
            "linux_arm64",
            "darwin_amd64",
            "darwin_arm64",
        }
    )
    assert tc.HASHICORP_BASE_URL == "https://releases.hashicorp.com"


def test_every_checksum_is_a_sha256_and_every_platform_has_one() -> None:
    for table in (pins.TERRAFORM_SHA256, pins.PACKER_SHA256):
        assert set(table) == set(pins.TERRAFORM_SHA256)
        assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in table.values()), table


def test_the_toolchain_and_the_connection_form_default_to_the_pins() -> None:
    """One source: what the toolchain installs and what the gcluster connection's form shows."""
    assert (tc.TERRAFORM_VERSION, tc.PACKER_VERSION) == (
        pins.TERRAFORM_DEFAULT_VERSION,
        pins.PACKER_DEFAULT_VERSION,
    )
    assert (tc.TERRAFORM_SHA256, tc.PACKER_SHA256) == (pins.TERRAFORM_SHA256, pins.PACKER_SHA256)
    for tool, version in (
        ("terraform", pins.TERRAFORM_DEFAULT_VERSION),
        ("packer", pins.PACKER_DEFAULT_VERSION),
    ):
        assert GCLUSTER_CONN_FIELDS[f"{tool}_version"]["schema"]["default"] == version
        assert GCLUSTER_UI_FIELD_BEHAVIOUR["placeholders"][f"{tool}_version"] == version
