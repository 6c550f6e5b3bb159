"""The webhook's certificates: verified with the ssl module as a TLS client (the API server) would."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from pathlib import Path

import pytest

from vllm_operator import certs
from vllm_operator.handlers.webhook import load_into

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
NAMES = ["vo-webhook.vllm-system.svc", "vo-webhook.vllm-system.svc.cluster.local"]


async def _handshake(server: ssl.SSLContext, bundle: bytes, hostname: str) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server)
    port = srv.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cadata=bundle.decode())
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname=hostname)
        writer.close()
    finally:
        srv.close()
        await srv.wait_closed()


def _server(pair: certs.KeyPair) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    load_into(context, pair)
    return context


async def test_serving_certificate_verifies_for_the_service_name_against_the_ca() -> None:
    now = dt.datetime.now(dt.UTC)
    ca = certs.new_ca("vo-webhook-ca", now)
    serving = certs.issue_serving(ca, NAMES, now)
    await _handshake(_server(serving), ca.cert_pem, NAMES[0])
    with pytest.raises(ssl.SSLCertVerificationError):
        await _handshake(_server(serving), ca.cert_pem, "other.vllm-system.svc")
    with pytest.raises(ssl.SSLCertVerificationError):
        await _handshake(_server(serving), certs.new_ca("x", now).cert_pem, NAMES[0])


async def test_during_ca_overlap_the_bundle_verifies_certificates_of_both_cas_and_a_reload_keeps_the_context(
) -> None:
    now = dt.datetime.now(dt.UTC)
    old, new = certs.new_ca("old", now), certs.new_ca("new", now)
    bundle = certs.bundle([new.cert_pem, old.cert_pem], now)
    assert len(certs.split_bundle(bundle)) == 2
    context = _server(certs.issue_serving(old, NAMES, now))
    await _handshake(context, bundle, NAMES[0])
    load_into(context, certs.issue_serving(new, NAMES, now))  # in place: same context, new certificate
    await _handshake(context, bundle, NAMES[0])
    await _handshake(context, new.cert_pem, NAMES[0])


def test_due_signed_by_and_lifetimes() -> None:
    ca = certs.new_ca("ca", NOW, dt.timedelta(days=100))
    serving = certs.issue_serving(ca, NAMES, NOW, dt.timedelta(days=30))
    assert serving.not_after == ca.not_after - dt.timedelta(days=70)
    assert not certs.due(serving.cert_pem, NOW + dt.timedelta(days=19), dt.timedelta(days=10))
    assert certs.due(serving.cert_pem, NOW + dt.timedelta(days=21), dt.timedelta(days=10))
    longer = certs.issue_serving(ca, NAMES, NOW, dt.timedelta(days=365))
    assert longer.not_after == ca.not_after, "a serving certificate never outlives its CA"
    assert certs.signed_by(serving.cert_pem, ca.cert_pem)
    assert not certs.signed_by(serving.cert_pem, certs.new_ca("other", NOW).cert_pem)


def test_bundle_drops_expired_cas_and_duplicates() -> None:
    short = certs.new_ca("short", NOW, dt.timedelta(days=1))
    long = certs.new_ca("long", NOW)
    later = NOW + dt.timedelta(days=2)
    assert certs.split_bundle(certs.bundle([long.cert_pem, short.cert_pem, long.cert_pem], later)) == [
        long.cert_pem]


def test_load_into_leaves_no_key_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    _server(certs.issue_serving(certs.new_ca("ca", NOW), NAMES, dt.datetime.now(dt.UTC)))
    assert list(tmp_path.iterdir()) == []
