"""`vllm-operator run`: start the kopf operator with our handlers, plus /healthz and /metrics.

One active operator (the chart runs one replica with Recreate): kopf runs `standalone`, because kopf peering
freezes operators of equal priority rather than electing one. The handlers are registered on a fresh registry per
run, so tests and the demo can run operators in-process without sharing state.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence

import kopf
from aiohttp import web

from vllm_operator import certs
from vllm_operator.handlers import admission, health, lifecycle
from vllm_operator.handlers.classes import ClassIndex
from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.metrics import OperatorMetrics
from vllm_operator.handlers.queue import WorkQueue
from vllm_operator.handlers.watched import OWNED_DEPLOYMENTS, WATCHED, Parents, WatchedChildren, watch_count
from vllm_operator.handlers.webhook import WebhookConfig
from vllm_operator.images import (
    DEFAULT_IMAGES,
    ENV_PULL_SECRETS,
    ENV_REPOSITORY,
    ImageDefaults,
    add_image_pull_secret_argument,
    add_image_repository_argument,
    with_pull_secrets,
)
from vllm_operator.k8s import DEPLOYMENTS, ClientKubeApi, Connection, CredentialsError, KubeApi
from vllm_operator.listen import listen_failure
from vllm_operator.planning import weights_cache

PROG = "vllm-operator run"
log = logging.getLogger(__name__)


class RoutineSuccessFilter(logging.Filter):
    """Drops kopf's INFO line for every successful run of the handler that keeps the watched VLLMDeployments.

    kopf logs "<handler> succeeded." after each run; for that handler it is one line per VLLMDeployment event (the
    health timer it replaced and kopf's Deployment events made 6,905 of the 16,100 lines of a 500-VLLMDeployment
    benchmark run), saying nothing. Failures, retries and the lifecycle handlers' lines stay, as do our own logs of
    what was done.
    """

    QUIET = frozenset({f"Handler {lifecycle.WATCH_ID!r} succeeded."})

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.getMessage() in self.QUIET)


class RetriedRequestFilter(logging.Filter):
    """kopf's "Request attempt #1/9 failed; will retry" becomes a WARNING: it is retried, not failed.

    kopf logs every retried API request at ERROR, so a routine 429 ("storage is (re)initializing" for the first
    seconds after `helm install` creates the CRDs, or API Priority and Fairness pushing back) reads as an operator
    error in the pod's log and in log-based alerts. The attempt that gives up ("failed; escalating") stays ERROR.
    """

    RETRIED = re.compile(r"Request attempt #?\d+(/\d+)? failed; will retry")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and self.RETRIED.match(record.getMessage()):
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


# The loggers kopf's API requests log their retries on: the watcher's own, and the per-object one of handlers'
# patches and posts.
RETRY_LOGGERS = ("kopf._cogs.clients.watching", "kopf.objects")


def quiet_routine_successes() -> None:
    """Install `RoutineSuccessFilter` and `admission.AdmissionLogFilter` on kopf's per-object logger and
    `RetriedRequestFilter` on the loggers kopf's request retries come from, once per process."""
    for names, kind in ((("kopf.objects",), RoutineSuccessFilter), (("kopf.objects",), admission.AdmissionLogFilter),
                        (RETRY_LOGGERS, RetriedRequestFilter)):
        for name in names:
            logger = logging.getLogger(name)
            if not any(isinstance(f, kind) for f in logger.filters):
                logger.addFilter(kind())


def build_registry(config: OperatorConfig, login: Callable[[], Awaitable[Connection]] | None = None
                   ) -> kopf.OperatorRegistry:
    """The operator's handlers; kopf logs in with `login` (the operator's own client's credentials) when given."""
    registry = kopf.OperatorRegistry()
    lifecycle.register(registry, config)

    if login is not None:
        # The same user on the same cluster as the operator's own client, read from that client rather than from
        # $KUBECONFIG: kopf logs in from a task of its own that may run after the operator reports ready, so an
        # environment variable set around the start (tests, embedders) could be gone by then.
        @kopf.on.login(registry=registry)
        async def _login_as_own_client(**_: object) -> kopf.ConnectionInfo:
            c = await login()
            return kopf.ConnectionInfo(server=c.server, ca_path=c.ca_path, insecure=c.insecure, scheme="Bearer"
                                       if c.token else None, token=c.token, certificate_path=c.certificate_path,
                                       private_key_path=c.private_key_path)
    else:
        # kopf's default login handlers live on its default registry, not on ours: log in as the pod's service
        # account in a cluster, else from the kubeconfig (KUBECONFIG or ~/.kube/config).
        @kopf.on.login(registry=registry)
        def _login_from_environment(settings: kopf.OperatorSettings, **kwargs: object) -> kopf.ConnectionInfo | None:
            return (kopf.login_with_service_account(settings=settings, **kwargs)
                    or kopf.login_with_kubeconfig(settings=settings, **kwargs))

    if config.health_enabled:
        health.register(registry, config)
    if config.webhook is not None:
        admission.register(registry, config)
    return registry


async def serve_http(config: OperatorConfig, metrics: OperatorMetrics, ready: asyncio.Event) -> web.AppRunner:
    """/healthz (200 once the operator is up) and /metrics on one port."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok" if ready.is_set() else "starting", status=200 if ready.is_set() else 503)

    async def metrics_(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.http_host, config.http_port).start()
    return runner


async def run_operator(config: OperatorConfig, kube: KubeApi | None = None, *,
                       stop_flag: asyncio.Event | threading.Event | None = None,
                       ready_flag: asyncio.Event | threading.Event | None = None) -> None:
    """Run until `stop_flag` is set (or forever). `kube` defaults to the environment's kubeconfig/in-cluster.

    kopf cancels every task created in its event loop after it started when it exits, so anything else that must
    keep running (a test's own servers and clients) belongs in another thread (tests/support/inprocess.py).
    """
    quiet_routine_successes()
    own_kube = kube is None
    kube_api: KubeApi = kube if kube is not None else await ClientKubeApi.from_environment()
    metrics = OperatorMetrics()
    ready = asyncio.Event()
    if ready_flag is not None:
        async def _signal_ready(flag: asyncio.Event | threading.Event) -> None:
            await ready.wait()
            flag.set()
        forwarder = asyncio.create_task(_signal_ready(ready_flag))
    runner: web.AppRunner | None = None
    queue = WorkQueue(config.max_concurrent_reconciles, delay=config.status_refresh_delay)
    metrics.reconciles_waiting.set_function(lambda: queue.waiting)
    metrics.reconciles_running.set_function(lambda: queue.running)
    # The health loop reads engine pods, Deployments and PDBs; without it only the Deployments are watched.
    watched = WATCHED if config.health_enabled else OWNED_DEPLOYMENTS
    watcher: KubeApi = kube_api
    if isinstance(kube_api, ClientKubeApi):
        watcher = kube_api.sibling(max_connections=watch_count(config.namespaces, watched))
    children = WatchedChildren(kube_api, watcher, config.namespaces, watched=watched,
                               on_api_list=metrics.health_api_lists.inc)
    metrics.watches_current.set_function(lambda: children.current_watches)
    metrics.watches_wanted.set_function(lambda: watch_count(config.namespaces, watched))
    memo = kopf.Memo(kube=kube_api, metrics=metrics, config=config, queue=queue, parents=Parents(),
                     classes=ClassIndex(enabled=config.workload_classes), children=children)
    children.on_change(DEPLOYMENTS, lifecycle.child_listener(memo, config))
    login = kube_api.connection if isinstance(kube_api, ClientKubeApi) else None
    # Started before kopf, which cancels on exit only the tasks made after it started; cancelled below.
    watching = asyncio.create_task(children.run())
    try:
        if config.http_port:
            runner = await serve_http(config, metrics, ready)
        await kopf.operator(
            registry=build_registry(config, login),
            standalone=True,
            clusterwide=not config.namespaces,
            namespaces=config.namespaces,
            memo=memo,
            stop_flag=stop_flag,
            ready_flag=ready,
        )
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        if watcher is not kube_api and isinstance(watcher, ClientKubeApi):
            await watcher.close()
        if ready_flag is not None:
            forwarder.cancel()
        if runner is not None:
            await runner.cleanup()
        if own_kube and isinstance(kube_api, ClientKubeApi):
            await kube_api.close()


def _images_from_environment(parser: argparse.ArgumentParser) -> ImageDefaults:
    """--image-repository's default: $VLLM_OPERATOR_IMAGE_REPOSITORY when set (the chart's operator.env can set
    it), else the project's registry."""
    value = os.environ.get(ENV_REPOSITORY)
    if not value:
        return DEFAULT_IMAGES
    try:
        return ImageDefaults(value)
    except ValueError as err:
        parser.error(f"${ENV_REPOSITORY}: {err}")


def add_webhook_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("admission webhook", "the planner at `kubectl apply` time (off unless "
                                      "--webhook-port is set; the chart sets these)")
    group.add_argument("--webhook-port", type=int, default=0, help="HTTPS port of the webhook (0 = off)")
    group.add_argument("--webhook-host", default=WebhookConfig.host, help="address to listen on (default %(default)s)")
    group.add_argument("--webhook-service", default=WebhookConfig.service,
                       help="the webhook's Service name: the certificate is for <service>.<namespace>.svc")
    group.add_argument("--webhook-namespace", default=os.environ.get("POD_NAMESPACE", WebhookConfig.namespace),
                       help="the operator's namespace (Service, CA Secret); default $POD_NAMESPACE or "
                       "%(default)s")
    group.add_argument("--webhook-ca-secret", default=WebhookConfig.ca_secret, help="Secret that keeps the CA")
    group.add_argument("--webhook-configuration", default=WebhookConfig.configuration,
                       help="ValidatingWebhookConfiguration whose caBundle the operator writes")
    group.add_argument("--webhook-cert-dir", default=None, help="read tls.crt/tls.key from here (cert-manager); "
                       "the operator then keeps no CA and writes no caBundle")
    group.add_argument("--webhook-check-interval", type=float, default=WebhookConfig.check_interval,
                       metavar="SECONDS", help="seconds between certificate checks (default %(default)s)")
    for flag, default in (("serving-lifetime", certs.SERVING_LIFETIME), ("serving-renew-before",
                                                                         certs.SERVING_RENEW_BEFORE),
                          ("ca-lifetime", certs.CA_LIFETIME), ("ca-renew-before", certs.CA_RENEW_BEFORE)):
        group.add_argument(f"--webhook-{flag}", type=float, default=default.total_seconds(), metavar="SECONDS",
                           help=f"certificate {flag.replace('-', ' ')} in seconds (default %(default).0f)")
    group.add_argument("--webhook-bundle-settle", type=float, default=WebhookConfig.bundle_settle,
                       metavar="SECONDS", help="wait after a caBundle change before serving a certificate of the "
                       "new CA (default %(default)s)")


def webhook_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> WebhookConfig | None:
    if not args.webhook_port:
        return None
    if not 0 < args.webhook_port < 65536:
        parser.error(f"--webhook-port {args.webhook_port}: not a TCP port")
    lifetimes = {k: dt.timedelta(seconds=getattr(args, f"webhook_{k}")) for k in
                 ("serving_lifetime", "serving_renew_before", "ca_lifetime", "ca_renew_before")}
    for kind in ("serving", "ca"):
        if lifetimes[f"{kind}_renew_before"] >= lifetimes[f"{kind}_lifetime"]:
            parser.error(f"--webhook-{kind}-renew-before must be shorter than --webhook-{kind}-lifetime")
    return WebhookConfig(port=args.webhook_port, host=args.webhook_host, service=args.webhook_service,
                         namespace=args.webhook_namespace, ca_secret=args.webhook_ca_secret,
                         configuration=args.webhook_configuration, cert_dir=args.webhook_cert_dir,
                         check_interval=args.webhook_check_interval, bundle_settle=args.webhook_bundle_settle,
                         **lifetimes)


def parse_args(argv: Sequence[str]) -> OperatorConfig:
    parser = argparse.ArgumentParser(prog=PROG, description="Run the vllm-operator controller.")
    parser.add_argument("--namespace", "-n", action="append", default=[],
                        help="watch only this namespace (repeatable); default: all namespaces")
    parser.add_argument("--all-namespaces", "-A", action="store_true", help="watch all namespaces (default)")
    parser.add_argument("--standalone", action="store_true", default=True,
                        help="no kopf peering; one active operator (always on, accepted for clarity)")
    parser.add_argument("--prometheus-url", default=None,
                        help="Prometheus base URL for metric-based diagnoses; unset turns them off")
    parser.add_argument("--no-health", action="store_true", help="disable the health loop (lifecycle only)")
    parser.add_argument("--no-workload-classes", action="store_true",
                        help="do not read VLLMWorkloadClasses (no cluster-scoped grant): built-in class names plan "
                             "from the operator's table, other names are refused")
    parser.add_argument("--port", type=int, default=8080, help="port for /healthz and /metrics (0 = off)")
    parser.add_argument("--status-refresh-delay", type=float, default=OperatorConfig.status_refresh_delay,
                        metavar="SECONDS", help="how long an owned Deployment's change waits for others to join "
                        "one status write (default %(default)s)")
    parser.add_argument("--max-concurrent-reconciles", type=int, default=OperatorConfig.max_concurrent_reconciles,
                        metavar="N", help="reconciles and health checks in flight at once, reconciles first; the "
                        "others wait in arrival order; status refreshes have N slots of their own "
                        "(default %(default)s)")
    add_image_repository_argument(parser, default=_images_from_environment(parser))
    add_image_pull_secret_argument(parser, default=[n.strip() for n in os.environ.get(ENV_PULL_SECRETS, "").split(",")
                                                    if n.strip()])
    add_webhook_arguments(parser)
    weights_cache.add_arguments(parser)
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    args = parser.parse_args(list(argv))
    if args.all_namespaces and args.namespace:
        parser.error("--all-namespaces and --namespace are exclusive")
    if args.max_concurrent_reconciles < 1:
        parser.error(f"--max-concurrent-reconciles {args.max_concurrent_reconciles}: must be at least 1")
    try:
        images = with_pull_secrets(args)
    except ValueError as err:
        parser.error(f"--image-pull-secret / ${ENV_PULL_SECRETS}: {err}")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return OperatorConfig(namespaces=tuple(args.namespace), prometheus_url=args.prometheus_url,
                          health_enabled=not args.no_health, http_port=args.port,
                          status_refresh_delay=args.status_refresh_delay, images=images,
                          node_cache=weights_cache.from_arguments(parser, args),
                          webhook=webhook_config(parser, args),
                          workload_classes=not args.no_workload_classes,
                          max_concurrent_reconciles=args.max_concurrent_reconciles)


def main(argv: Sequence[str]) -> int:
    config = parse_args(argv)

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await run_operator(config, stop_flag=stop)

    try:
        asyncio.run(_main())
    except KeyboardInterrupt:
        return 130
    except CredentialsError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        message = listen_failure(err, config.http_host, config.http_port)
        if message is None:
            raise
        print(f"{PROG}: {message} (serves /healthz and /metrics; 0 turns it off)", file=sys.stderr)
        return 2
    log.info("Stopped the operator")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
