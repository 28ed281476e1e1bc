"""`gpu_host.certfile` + `keyfile`: the host serves HTTPS with real `trustme` certificates."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import httpx
import pytest

from gpu_host.main import check_tls, hypercorn_config
from shared.settings import GpuHostSettings
from tests.fakes.tls import tls_files
from tests.gpu_host.conftest import MEASURE, auth
from tests.gpu_host.fake_child import scripted
from tests.gpu_host.inprocess import host_settings, running_host


async def test_host_serves_https_that_verifies_against_its_ca_and_only_that(tmp_path: Path) -> None:
    files = tls_files(tmp_path / "tls")
    other = tls_files(tmp_path / "other")  # a CA that did not sign the host's certificate
    settings = host_settings(certfile=str(files.certfile), keyfile=str(files.keyfile))
    async with running_host(tmp_path, settings, ca_file=files.ca_file) as host:
        assert host.url.startswith("https://")
        trusting = ssl.create_default_context(cafile=str(files.ca_file))
        async with httpx.AsyncClient(base_url=host.url, headers=auth(), verify=trusting) as client:
            health = await client.get("/health")
            answer = await client.post(MEASURE, files={"image": ("p.png", scripted(b"ok"), "image/png")})
        wrong_ca = ssl.create_default_context(cafile=str(other.ca_file))
        async with httpx.AsyncClient(base_url=host.url, verify=wrong_ca) as stranger:
            with pytest.raises(httpx.ConnectError) as refused:
                await stranger.get("/health")
        async with httpx.AsyncClient(base_url=host.url.replace("https", "http")) as plain:
            with pytest.raises(httpx.TransportError):  # no plaintext listener beside the TLS one
                await plain.get("/health")
    assert (health.status_code, health.json()["status"]) == (200, "ok")
    assert answer.json()["code"] == 0
    assert _caused_by(refused.value, ssl.SSLCertVerificationError)


def _caused_by(error: BaseException | None, kind: type[BaseException]) -> bool:
    while error is not None:
        if isinstance(error, kind):
            return True
        error = error.__cause__ or error.__context__
    return False


def test_unloadable_certificate_stops_the_start_naming_the_keys(tmp_path: Path) -> None:
    files = tls_files(tmp_path)
    broken = tmp_path / "broken.pem"
    broken.write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
    config = hypercorn_config(GpuHostSettings(certfile=str(broken), keyfile=str(files.keyfile)), "127.0.0.1:0")
    with pytest.raises(ValueError, match=re.escape("gpu_host.certfile")):
        check_tls(config)
    good = hypercorn_config(GpuHostSettings(certfile=str(files.certfile), keyfile=str(files.keyfile)), "127.0.0.1:0")
    check_tls(good)
    assert isinstance(good.create_ssl_context(), ssl.SSLContext)


def test_certfile_without_keyfile_is_a_settings_error() -> None:
    with pytest.raises(ValueError, match="certfile and keyfile"):
        GpuHostSettings(certfile="/etc/hairgate/host.pem")
