"""The sandbox's gcloud refuses the Secret Manager command lines the real gcloud's parser refuses.

For the commands the provider renders for the token's versions and readers (``secrets update``,
``secrets versions list/disable``, ``secrets remove-iam-policy-binding``): each argv goes through
the real Google Cloud CLI offline (a parse error, or "no active account" once parsed) and through
the sandbox's fake (exit code 2 = usage error); both must agree on refused vs. parsed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.render.test_real_gcloud import GCLOUD, NO_ACCOUNT, PARSE_ERROR, run_gcloud
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo

pytestmark = pytest.mark.skipif(GCLOUD is None, reason="the Google Cloud CLI is not installed")

S, P = "tpu-rl-hf-token-x", "--project=my-proj-123"
MEMBER, ROLE = "--member=serviceAccount:a@my-proj-123.iam.gserviceaccount.com", "--role=roles/viewer"
CASES: list[tuple[tuple[str, ...], bool]] = [  # (argv after "gcloud", refused by the parser)
    (("secrets", "update", S, P, "--update-annotations=tpu-rl-hf-token-hmac=ab.cd"), False),
    (("secrets", "update", S, P, "--update-annotations=a=b", "--clear-annotations"), True),
    (("secrets", "update", S, P, "--update-annotations=a=b", "--remove-annotations=a"), True),
    (("secrets", "update", S, P, "--update-annotation=a=b"), True),
    (("secrets", "update", S, P, "--update-annotations=novalue"), True),
    (("secrets", "update", P, "--update-annotations=a=b"), True),
    (("secrets", "versions", "list", S, P, "--format=json"), False),
    (("secrets", "versions", "list", S, P, "--format=json", "--limit=3"), False),
    (("secrets", "versions", "list", S, P, "--data-file=-"), True),
    (("secrets", "versions", "disable", "1", f"--secret={S}", P), False),
    (("secrets", "versions", "disable", "1", f"--secrets={S}", P), True),
    (("secrets", "remove-iam-policy-binding", S, P, MEMBER, ROLE, "--condition=None"), False),
    (("secrets", "remove-iam-policy-binding", S, P, MEMBER, ROLE, "--all"), False),
    (("secrets", "remove-iam-policy-binding", S, P, MEMBER, ROLE, "--all", "--condition=None"), True),
    (("secrets", "remove-iam-policy-binding", S, P, MEMBER, "--condition=None"), True),
    (("secrets", "remove-iam-policy-binding", S, P, ROLE, "--condition=None"), True),
]


@pytest.mark.parametrize(
    ("argv", "refused"), CASES, ids=lambda v: " ".join(v[1:4]) if isinstance(v, tuple) else ""
)
def test_the_fake_and_the_real_gcloud_agree(
    sandbox: SandboxInfo, tmp_path: Path, argv: tuple[str, ...], refused: bool
) -> None:
    _, output = run_gcloud(("gcloud", *argv), tmp_path)
    if refused:
        assert PARSE_ERROR.search(output), f"real gcloud parsed {argv}:\n{output[-1500:]}"
    else:
        assert NO_ACCOUNT in output, f"real gcloud refused {argv}:\n{output[-1500:]}"
    fake = subprocess.run(
        [str(sandbox.gcloud), *argv],
        env=sandbox.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    fake_output = fake.stdout + fake.stderr
    if refused:
        assert fake.returncode == 2, f"the fake parsed {argv}:\n{fake_output}"
    else:
        assert fake.returncode != 2, f"the fake refused {argv}:\n{fake_output}"
