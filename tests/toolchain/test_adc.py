"""Application Default Credentials as ``gcluster job submit`` finds them (toolchain/adc.py), in
golang/oauth2's order: ``GOOGLE_APPLICATION_CREDENTIALS`` (no fallback when it does not load), the
well-known file under ``$HOME`` (never ``CLOUDSDK_CONFIG``), then the metadata server, reached
directly; and the ADC file the worker itself has."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.toolchain import adc

CLOSED = "127.0.0.1:9"  # no metadata server there: refused at once


def _well_known(folder: Path, text: str = "{not json") -> Path:
    path = folder / ".config" / "gcloud" / adc.WELL_KNOWN_NAME
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_a_credentials_file_that_does_not_load_is_the_problem_with_no_fallback(tmp_path: Path) -> None:
    _well_known(tmp_path)  # there, but golang/oauth2 never looks further
    broken = tmp_path / "key.json"
    broken.write_text("{not json")

    status = adc.find_adc({adc.ADC_ENV: str(broken), "HOME": str(tmp_path)}, timeout=5)

    assert not status.ok
    assert status.problem is not None
    assert status.problem.startswith(f"{adc.ADC_ENV}={broken}: ")


def test_the_well_known_file_is_found_under_home_not_cloudsdk_config(tmp_path: Path) -> None:
    known = _well_known(tmp_path / "home")
    status = adc.find_adc({"HOME": str(tmp_path / "home"), adc.METADATA_HOST_ENV: CLOSED}, timeout=5)
    assert str(status.problem).startswith(f"{known}: ")  # found there (and it does not load)

    config = tmp_path / "config"
    config.mkdir()
    (config / adc.WELL_KNOWN_NAME).write_text("{not json")
    env = {"HOME": str(tmp_path / "empty"), "CLOUDSDK_CONFIG": str(config), adc.METADATA_HOST_ENV: CLOSED}
    assert str(adc.find_adc(env, timeout=5).problem).startswith(
        f"no {adc.ADC_ENV}, no {adc.WELL_KNOWN_NAME} in its HOME, not on Google Cloud: no metadata server at {CLOSED}"
    )


class _Metadata(BaseHTTPRequestHandler):
    flavor: str | None = "Google"
    body: dict[str, str] = {"access_token": "ya29.token"}

    def do_GET(self) -> None:
        assert self.path.startswith(adc.METADATA_TOKEN_PATH)
        self.send_response(200)
        if self.flavor:
            self.send_header("Metadata-Flavor", self.flavor)
        self.end_headers()
        self.wfile.write(json.dumps(self.body).encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metadata_server() -> Iterator[tuple[str, type[_Metadata]]]:
    handler = type("Handler", (_Metadata,), {})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_the_metadata_server_is_reached_directly_even_with_a_proxy_set(
    tmp_path: Path, metadata_server: tuple[str, type[_Metadata]], monkeypatch: pytest.MonkeyPatch
) -> None:
    host, _ = metadata_server
    monkeypatch.setenv("http_proxy", f"http://{CLOSED}")
    monkeypatch.setenv("HTTP_PROXY", f"http://{CLOSED}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)

    status = adc.find_adc({"HOME": str(tmp_path), adc.METADATA_HOST_ENV: host}, timeout=5)

    assert (status.ok, status.source) == (True, "the metadata server")


def test_a_server_without_googles_header_or_token_is_no_metadata_server(
    tmp_path: Path, metadata_server: tuple[str, type[_Metadata]]
) -> None:
    host, handler = metadata_server
    env = {"HOME": str(tmp_path), adc.METADATA_HOST_ENV: host}
    handler.flavor = None
    assert str(adc.find_adc(env, timeout=5).problem).endswith(
        f"not on Google Cloud: {host} is no metadata server"
    )
    handler.flavor, handler.body = "Google", {}
    assert str(adc.find_adc(env, timeout=5).problem).endswith("the metadata server gave no token")


def test_the_workers_own_adc_file_is_gclouds_config_first_then_home(tmp_path: Path) -> None:
    home, config = tmp_path / "home", tmp_path / "config"
    assert adc.worker_adc_file({"HOME": str(home)}) is None
    in_home = _well_known(home, "{}")
    assert adc.worker_adc_file({"HOME": str(home), "CLOUDSDK_CONFIG": str(config)}) == str(in_home)
    config.mkdir()
    (config / adc.WELL_KNOWN_NAME).write_text("{}")
    assert adc.worker_adc_file({"HOME": str(home), "CLOUDSDK_CONFIG": str(config)}) == str(
        config / adc.WELL_KNOWN_NAME
    )
