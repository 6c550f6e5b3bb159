"""The admission webhook's HTTPS server and the certificates it serves, on kopf's event loop.

kopf's own `WebhookServer` loads its certificate once per listening socket: on a changed file it closes the socket
and opens a new one, and while it does, the API server's calls fail (with failurePolicy Fail: refused applies).
This server keeps one socket and one `ssl.SSLContext` and loads a renewed certificate into that context in place;
handshakes after the reload get the new certificate, connections already open keep theirs. kopf's `managed` mode
stays off (the chart owns the ValidatingWebhookConfiguration) and no tunnel is ever opened.

Where certificates come from:
- By default (`CertKeeper`): a CA kept in a Secret of the operator's namespace (created on first start, renewed a
  year before it expires), and serving certificates for `<service>.<namespace>.svc` it signs in memory (reissued
  on every start and 10 days before expiry). The keeper writes the CA certificates into the webhook
  configuration's caBundle; when the CA is renewed, the bundle carries the old and the new CA while both are valid,
  and the serving certificate switches to the new CA only after that bundle was published and had time to reach
  the API servers — so at no moment does the API server hold a bundle that does not verify the certificate served.
- With cert-manager (`FileCerts`): tls.crt/tls.key from a mounted Secret, re-read every check interval;
  cert-manager's CA injector owns the caBundle.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import kopf
from aiohttp import web

from vllm_operator import certs
from vllm_operator.k8s import SECRETS, VALIDATING_WEBHOOKS, KubeApi, KubeError

log = logging.getLogger(__name__)

CA_CERT, CA_KEY, PREVIOUS_CA_CERT = "ca.crt", "ca.key", "previous-ca.crt"


@dataclass(frozen=True)
class WebhookConfig:
    """Where the webhook listens and how its certificates are kept (`vllm-operator run --webhook-*`)."""

    port: int = 9443
    host: str = "0.0.0.0"  # the API server dials the operator pod's address
    service: str = "vllm-operator-webhook"  # the Service the configuration names: certificates are for it
    namespace: str = "default"  # the operator's own namespace: the Service's and the CA Secret's
    ca_secret: str = "vllm-operator-webhook-ca"
    configuration: str = "vllm-operator"  # ValidatingWebhookConfiguration whose caBundle the keeper writes
    cert_dir: str | None = None  # cert-manager: tls.crt and tls.key are mounted here; no CA, no caBundle writes
    check_interval: float = 60.0  # seconds between certificate checks
    serving_lifetime: dt.timedelta = certs.SERVING_LIFETIME
    serving_renew_before: dt.timedelta = certs.SERVING_RENEW_BEFORE
    ca_lifetime: dt.timedelta = certs.CA_LIFETIME
    ca_renew_before: dt.timedelta = certs.CA_RENEW_BEFORE
    bundle_settle: float = 10.0  # seconds a new caBundle is given to reach the API servers before it is relied on

    @property
    def dns_names(self) -> list[str]:
        base = f"{self.service}.{self.namespace}"
        return [f"{base}.svc", f"{base}.svc.cluster.local", base, self.service]


def load_into(context: ssl.SSLContext, pair: certs.KeyPair) -> None:
    """Load a certificate and key into a live context (the ssl module reads them only from files)."""
    with tempfile.TemporaryDirectory(prefix="vllm-operator-tls-") as tmp:
        cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert.write_bytes(pair.cert_pem)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(pair.key_pem)
        context.load_cert_chain(cert, key)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class CertKeeper:
    """The CA in a Secret, serving certificates it signs, and the caBundle that trusts them (see the module doc)."""

    def __init__(self, config: WebhookConfig, kube: KubeApi) -> None:
        self.config = config
        self.kube = kube
        self.serving: certs.KeyPair | None = None
        self.published: bytes | None = None

    async def refresh(self, context: ssl.SSLContext) -> None:
        """Load a current serving certificate into `context` when it has none or its certificate is due."""
        now = _now()
        ca, previous = await self._ensure_ca(now)
        bundle = certs.bundle([ca.cert_pem, *([previous] if previous else [])], now)
        changed = await self._publish(bundle)
        serving = self.serving
        if (serving is None or certs.due(serving.cert_pem, now, self.config.serving_renew_before)
                or not certs.signed_by(serving.cert_pem, ca.cert_pem)):
            if changed and serving is not None:
                # The old certificate still verifies against the bundle (its CA is in it); the new one only once
                # the API servers have the new bundle.
                await asyncio.sleep(self.config.bundle_settle)
            self.serving = certs.issue_serving(ca, self.config.dns_names, _now(), self.config.serving_lifetime)
            load_into(context, self.serving)
            log.info("Loaded a webhook serving certificate for %s valid until %s", self.config.dns_names[0],
                     self.serving.not_after.isoformat())

    async def _ensure_ca(self, now: dt.datetime) -> tuple[certs.KeyPair, bytes | None]:
        cfg = self.config
        secret = await self.kube.get(SECRETS, cfg.namespace, cfg.ca_secret)
        try:
            if secret is None:
                ca = certs.new_ca(f"{cfg.service}-ca", now, cfg.ca_lifetime)
                await self.kube.create(SECRETS, cfg.namespace, {
                    "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                    "metadata": {"name": cfg.ca_secret, "namespace": cfg.namespace},
                    "data": _b64({CA_CERT: ca.cert_pem, CA_KEY: ca.key_pem})})
                log.info("Created the webhook CA in Secret %s/%s (valid until %s)", cfg.namespace, cfg.ca_secret,
                         ca.not_after.isoformat())
                return ca, None
            data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
            if CA_CERT not in data or CA_KEY not in data:
                raise KubeError(422, "Invalid", f"Secret {cfg.namespace}/{cfg.ca_secret} lacks {CA_CERT} or "
                                f"{CA_KEY}; delete it and the operator creates a new CA")
            ca = certs.KeyPair(data[CA_CERT], data[CA_KEY])
            if not certs.due(ca.cert_pem, now, cfg.ca_renew_before):
                return ca, data.get(PREVIOUS_CA_CERT)
            renewed = certs.new_ca(f"{cfg.service}-ca", now, cfg.ca_lifetime)
            await self.kube.patch(SECRETS, cfg.namespace, cfg.ca_secret, {
                "metadata": {"resourceVersion": secret["metadata"]["resourceVersion"]},
                "data": _b64({CA_CERT: renewed.cert_pem, CA_KEY: renewed.key_pem, PREVIOUS_CA_CERT: ca.cert_pem})})
        except KubeError as err:
            if not err.conflict:
                raise
            return await self._ensure_ca(now)  # created or renewed meanwhile by another operator process
        log.info("Renewed the webhook CA in Secret %s/%s (old one valid until %s, new one until %s)",
                 cfg.namespace, cfg.ca_secret, ca.not_after.isoformat(), renewed.not_after.isoformat())
        return renewed, ca.cert_pem

    async def _publish(self, bundle: bytes) -> bool:
        """Write `bundle` into every webhook of the configuration; True when it changed there."""
        if bundle == self.published:
            return False
        cfg = self.config
        configuration = await self.kube.get(VALIDATING_WEBHOOKS, None, cfg.configuration)
        if configuration is None:
            log.warning("ValidatingWebhookConfiguration %s was not found; its caBundle was not written",
                        cfg.configuration)
            return False
        wanted = base64.b64encode(bundle).decode()
        webhooks = configuration.get("webhooks") or []
        stale = [w for w in webhooks if (w.get("clientConfig") or {}).get("caBundle") != wanted]
        for webhook in stale:
            webhook.setdefault("clientConfig", {})["caBundle"] = wanted
        if stale:
            await self.kube.patch(VALIDATING_WEBHOOKS, None, cfg.configuration, {
                "metadata": {"resourceVersion": configuration["metadata"]["resourceVersion"]},
                "webhooks": webhooks})
            log.info("Wrote %d CA certificate(s) into the caBundle of ValidatingWebhookConfiguration %s",
                     len(certs.split_bundle(bundle)), cfg.configuration)
        self.published = bundle
        return bool(stale)


class FileCerts:
    """tls.crt/tls.key from a directory (a Secret cert-manager renews), reloaded when their content changes."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)
        self.loaded: tuple[bytes, bytes] | None = None

    async def refresh(self, context: ssl.SSLContext) -> None:
        current = ((self.directory / "tls.crt").read_bytes(), (self.directory / "tls.key").read_bytes())
        if current != self.loaded:
            load_into(context, certs.KeyPair(*current))
            self.loaded = current
            log.info("Loaded the webhook serving certificate from %s", self.directory)


def _b64(data: Mapping[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in data.items()}


class WebhookServer:
    """kopf's webhook server protocol: one HTTPS socket for the process's life, certificates reloaded in place."""

    def __init__(self, config: WebhookConfig, kube: KubeApi) -> None:
        self.config = config
        self.certificates = FileCerts(config.cert_dir) if config.cert_dir else CertKeeper(config, kube)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.bound_port: int | None = None

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self.config.check_interval)
            try:
                await self.certificates.refresh(self.context)
            except (KubeError, OSError, ValueError) as err:
                log.warning("Webhook certificates were not refreshed (retried in %.0f s): %s",
                            self.config.check_interval, err)

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        await self.certificates.refresh(self.context)

        async def serve(request: web.Request) -> web.Response:
            try:
                review = json.loads(await request.text())
            except json.JSONDecodeError as err:
                raise web.HTTPBadRequest(reason=f"not JSON: {err}") from None
            sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
            response = await fn(review, webhook=request.match_info.get("id"), headers=dict(request.headers),
                                sslpeer=sslpeer)
            return web.json_response(response)

        app = web.Application()
        app.router.add_post("/{id:.*}", serve)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        keeper = None
        try:
            site = web.TCPSite(runner, self.config.host, self.config.port, ssl_context=self.context)
            await site.start()
            server = getattr(site, "_server", None)
            sockets = getattr(server, "sockets", None) or []
            self.bound_port = sockets[0].getsockname()[1] if sockets else self.config.port
            log.info("Serving the admission webhook on https://%s:%s", self.config.host, self.bound_port)
            keeper = asyncio.create_task(self._keep(), name="webhook certificates")
            # Only kopf's managed mode reads this (off: the chart owns the configuration).
            yield kopf.WebhookClientConfig(url=f"https://{self.config.dns_names[0]}:{self.bound_port}")
            await asyncio.Event().wait()
        finally:
            if keeper is not None:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
            await runner.cleanup()


def install(settings: kopf.OperatorSettings, config: WebhookConfig, kube: KubeApi) -> WebhookServer:
    """Serve admission through our server; never kopf's managed configuration, never a tunnel."""
    server = WebhookServer(config, kube)
    settings.admission.server = server
    settings.admission.managed = None
    return server
