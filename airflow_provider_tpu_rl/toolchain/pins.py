"""The Terraform and Packer releases gcluster checks for, and their checksums: the connections'
default versions (``hooks/connection_fields.py``) and what ``tools.py`` installs and verifies.
Plain data, imported by the provider metadata (no Airflow import)."""

from __future__ import annotations

# cluster-toolkit pkg/dependencies/checksums_generated.go (TerraformVersion, PackerVersion,
# ExpectedChecksums: the SHA-256 of HashiCorp's <tool>_<version>_<os>_<arch>.zip). v1.103.0 was not
# in the mirror; these values are identical at tag v1.95.0 and on develop of 2026-06-25 (1047080).
TERRAFORM_DEFAULT_VERSION = "1.12.2"
PACKER_DEFAULT_VERSION = "1.15.0"
TERRAFORM_SHA256: dict[str, str] = {
    "darwin_amd64": "c65aa74bed1dbb1c48ba4bbab11f08e7f7eeb54a422146561490275340468f19",
    "darwin_arm64": "1ca02f336ff4f993d6441806d38a0bcc0bbca0e3c877b84c9c2dc80cfcd0dc8b",
    "linux_amd64": "1eaed12ca41fcfe094da3d76a7e9aa0639ad3409c43be0103ee9f5a1ff4b7437",
    "linux_arm64": "f8a0347dc5e68e6d60a9fa2db361762e7943ed084a773f28a981d988ceb6fdc9",
}
PACKER_SHA256: dict[str, str] = {
    "darwin_amd64": "a565b825aed17ac9a7c422b5ed22e6598dd42b9f705de161695853b1f5c6bd80",
    "darwin_arm64": "ebd8eb03503627471f39b036ff5dbb24070d21518d59aa8cbf962386257d21a4",
    "linux_amd64": "2fd1149c5c6c7604ced64d7b56638af05f6b7ed3f6835182bc913ddaba1f16b8",
    "linux_arm64": "1687f43bd120601f62e54b970b1cc06f83e95897357dc5c679b57ec9d2fb40a7",
}
