"""The application factory. The lifespan owns the engine, the listener and the
background tasks; nothing is created at import time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import __version__
from app.api import openapi, problems
from app.api.horizon_gauges import HorizonGauges
from app.api.metrics import Metrics
from app.api.queue_gauges import QueueGauges
from app.api.routes import docs, health, keys, messages, queues, redrive
from app.asgi import header_limits
from app.asgi.access import AccessLog
from app.asgi.body_budget import BodyBudget, ProvenCallers
from app.asgi.lean import Front, LeanApp, declares_more_than
from app.auth.access import Needs
from app.auth.guard import Guard, RateLimiter, Rules, is_sqs_door
from app.auth.receipt_keys import ReceiptKeyring
from app.auth.sessions import DashboardSessions
from app.auth.store import KeyStore
from app.config import Settings
from app.credentials import parse_credentials
from app.db.connector import Connector, DatabaseError
from app.db.engine import create_engine, dialer, split_pool
from app.db.epochs import Epochs
from app.errors import DatabaseUnavailable, LeaseqError
from app.queue.catalog import QueueCatalog
from app.queue.fairness import FairnessRounds
from app.queue.generations import EPOCH_LOCKS, Generations
from app.queue.horizon import Horizon, HorizonWatch
from app.queue.kinds import group_commit
from app.queue.maintenance import Maintenance
from app.queue.redrive import Redrives
from app.queue.retention import sweep_forever
from app.queue.rotation import Rotation
from app.queue.service import QueueService
from app.queue.sql import Q
from app.queue.vacuum import vacuum_forever
from app.queue.waiting import Listener, WaitHub
from app.sqs import routes as sqs
from app.stopping import on_stop_signal
from app.ui import routes as ui
from app.ui.throughput import Throughput

_log = logging.getLogger(__name__)


class _BodyTooLarge(StarletteHTTPException):
    # An HTTPException, not a plain Exception: FastAPI turns any other exception
    # raised while it reads the body into "400 There was an error parsing the
    # body", so a chunked body over the limit (no Content-Length to refuse up
    # front) answered 400 `http_error` instead of 413 `request_too_large`.
    # FastAPI re-raises HTTPExceptions untouched; problems.install maps 413.
    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"The request body is larger than {max_bytes} bytes.")


SMALL_BODY_BYTES = 1024 * 1024
"""The body limit of every route but sends: the largest of their bodies (a
batch of receipt handles, a 64 KiB checkpoint cursor) is far below it."""
_SEND_PATH = re.compile(r"^/v1/queues/[^/]+/messages$")


class LimitBody:
    """Refuses request bodies over a size (413, even when chunked). Sends (REST
    and the SQS door) may carry a full batch of the largest messages; other
    routes, a megabyte."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.send_bytes = max_bytes
        self.other_bytes = min(max_bytes, SMALL_BODY_BYTES)

    def limit_for(self, scope: Scope) -> int:
        target = scope["path"]
        sends = (scope["method"] == "POST" and _SEND_PATH.match(target) is not None) or (
            is_sqs_door(target)
        )
        return self.send_bytes if sends else self.other_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.limit_for(scope)
        declared = next((value for name, value in scope["headers"]
                         if name == b"content-length"), None)
        if declares_more_than(declared, max_bytes):
            await self.too_large(scope, send, max_bytes)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    raise _BodyTooLarge(max_bytes)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except _BodyTooLarge:
            if started:
                raise
            await self.too_large(scope, send, max_bytes)

    async def too_large(self, scope: Scope, send: Send, max_bytes: int) -> None:
        response = problems.problem(
            413, "request_too_large", f"The request body is larger than {max_bytes} bytes."
        )
        await response(scope, _empty_receive, send)


async def _empty_receive() -> Message:
    return {"type": "http.disconnect"}


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    # Each process's connections (a worker process of --workers builds its app here).
    header_limits.configure(header_limits.HeaderLimits(
        timeout=settings.header_timeout_seconds,
        max_bytes=settings.max_header_bytes,
        max_unfinished=settings.unfinished_headers_limit(),
        body_timeout=settings.body_timeout_seconds,
        body_min_rate=settings.body_min_bytes_per_second,
    ))
    database_url = settings.database_url
    if database_url is None:
        raise RuntimeError("create_app needs DATABASE_URL; `leaseq serve` provides one")
    credentials = (
        None if settings.sqs_credentials is None
        else parse_credentials(settings.sqs_credentials.get_secret_value())
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The pools, the LISTEN connection and the maintenance lock share one
        # dialer: which host answered last (app/db/hosts.py).
        dial = dialer(settings)
        listen_url = settings.listen_url or database_url
        planned, cached = split_pool(settings.pool_size)
        engine = create_engine(
            database_url, pool_size=planned, pool_timeout=settings.pool_wait_seconds,
            dial=dial, pgbouncer=settings.pgbouncer,
        )
        cached_engine = None if not cached else create_engine(
            database_url, pool_size=cached, pool_timeout=settings.pool_wait_seconds,
            cached_plans=True, dial=dial, pgbouncer=settings.pgbouncer,
        )
        hub = WaitHub(
            max_waiters=settings.max_waiters,
            max_waiters_per_queue=settings.max_waiters_per_queue,
            max_waiters_per_key=settings.waiters_per_key(),
            max_waiters_per_key_on_a_queue=settings.waiters_per_key_on_a_queue(),
        )
        db = Connector(engine, cached_engine)
        # Which generation of the messages each statement names, by the epoch
        # this process holds (app/queue/generations.py).
        generations = Generations()
        generations.epochs = Epochs(
            listen_url, Q.current_epoch, space=EPOCH_LOCKS,
            on_view=generations.on_view, dial=dial,
        )
        db.router = generations
        master = settings.master_secret()
        keyring = ReceiptKeyring(db, legacy=master)
        keys = KeyStore(
            db, master=master, listening=lambda: hub.listening, static=credentials,
        )
        sessions = DashboardSessions(
            db, master=master, keys=keys, listening=lambda: hub.listening,
            lifetime=settings.dashboard_session_seconds,
        )
        listener = Listener(
            listen_url, hub, dial=dial,
            notices=(keys.on_notice, keyring.on_notice, sessions.on_notice),
        )
        catalog = QueueCatalog(db, hub)
        # Once across the fleet: the process holding the maintenance lock sweeps,
        # vacuums and warns of a held horizon (app/queue/maintenance.py); redrive
        # tasks have leases.
        maintenance = Maintenance(listen_url, dial=dial)
        group = group_commit(db)
        horizon = Horizon(db, warn_seconds=settings.horizon_warn_seconds)
        metrics = Metrics(
            hub, group, QueueGauges(catalog.gauges, catalog.existing), maintenance,
            HorizonGauges(horizon),
        )
        service = QueueService(
            db, catalog, hub, keyring.signer, group=group, events=metrics,
            pool_wait_seconds=settings.pool_wait_seconds,
        )
        loading = asyncio.create_task(_load_keys(keyring, keys, settings), name="leaseq-keys")
        # Serve once the keys are loaded; a database that cannot be reached yet
        # does not hold the start up: requests answer 503 until it can.
        await asyncio.wait([loading], timeout=settings.pool_wait_seconds)
        if loading.done():
            loading.result()  # a misconfiguration (LEASEQ_ADMIN_KEY) stops the start here
        # SIGTERM: parked long polls answer at once instead of holding the drain.
        stop_hook = on_stop_signal(hub.close)
        app.state.keys = keys
        app.state.sessions = sessions
        app.state.keyring = keyring
        app.state.settings = settings
        app.state.hub = hub
        app.state.db = db
        app.state.listener = listener
        app.state.service = service
        app.state.swept = asyncio.Event()
        app.state.maintenance = maintenance
        app.state.generations = generations
        app.state.rotation = rotation = Rotation(db, rotate_after=settings.rotate_after)
        app.state.horizon_watch = horizon_watch = HorizonWatch(horizon)
        app.state.metrics = metrics
        app.state.throughput = throughput = Throughput(metrics.message_totals)
        app.state.redrives = redrives = Redrives(
            db, catalog, hold_seconds=settings.redrive_hold_seconds
        )
        listener.start()
        background = [
            generations.epochs.start(),
            maintenance.lock.start(),
            asyncio.create_task(
                rotation.forever(1.0, only_while=maintenance.lock), name="leaseq-rotation",
            ),
            asyncio.create_task(
                sweep_forever(
                    db, settings.retention_sweep_seconds, app.state.swept,
                    only_while=maintenance.lock,
                ),
                name="leaseq-retention",
            ),
            asyncio.create_task(
                redrives.run_forever(settings.redrive_scan_seconds),
                name="leaseq-redrive",
            ),
            asyncio.create_task(
                vacuum_forever(db, settings.vacuum_check_seconds, only_while=maintenance.lock),
                name="leaseq-vacuum",
            ),
            asyncio.create_task(
                FairnessRounds(db, catalog.fair_floors).forever(only_while=maintenance.lock),
                name="leaseq-fairness",
            ),
            asyncio.create_task(
                horizon_watch.forever(settings.vacuum_check_seconds,
                                      only_while=maintenance.lock),
                name="leaseq-horizon",
            ),
            asyncio.create_task(catalog.tally.forever(db), name="leaseq-tally"),
        ]
        background.append(asyncio.create_task(
            _refresh_metrics_forever(metrics, throughput), name="leaseq-metrics"
        ))
        try:
            yield
        finally:
            stop_hook()
            hub.close()
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            # The last second's processing time, while the database is still there.
            with contextlib.suppress(Exception):
                await catalog.tally.flush(db)
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            await listener.stop()
            keyring.close()
            await keys.close()
            await engine.dispose()
            if cached_engine is not None:
                await cached_engine.dispose()

    app = LeanApp(
        title="leaseq",
        version=__version__,
        summary="A durable lease-based message queue on PostgreSQL with SQS semantics.",
        lifespan=lifespan,
        # Served by app/api/routes/docs.py instead, with local assets (FastAPI's
        # pages load theirs from a CDN).
        docs_url=None,
        redoc_url=None,
        # 413: the body limit below applies to every route.
        responses=openapi.responses(413, 422, 500),
        generate_unique_id_function=openapi.operation_id,
        telemetry=None if settings.telemetry else {
            "tracing": False, "metrics": False, "logs": False, "operation_spans": False,
        },
    )
    app.state.limiter = limiter = RateLimiter(
        settings.key_rate, concurrency=settings.requests_per_key())
    # SQS bodies held before their signature is checked (app/asgi/body_budget.py):
    # one client address holds at most one full request of them; callers proven
    # lately have a budget of their own, which no forger reaches.
    app.state.unproven = BodyBudget(settings.unproven_body_limit(),
                                    per_address=settings.request_limit())
    app.state.unproven_known = BodyBudget(settings.unproven_body_limit(),
                                          per_address=settings.request_limit())
    app.state.proven = ProvenCallers()
    app.state.unproven_by_key = {}  # what strangers naming each key id hold of it
    problems.install(app)
    openapi.install_openapi(app)
    # Routes are matched in order: the message routes, most of the traffic, first;
    # last, the queue URL route (/{account}/{queue}), which must not shadow any REST path.
    routers = (messages.router, queues.router, redrive.router, keys.router, health.router,
               docs.router, ui.router, sqs.router)
    for router in routers:
        app.include_router(router)
    app.serve_lean(messages.router.routes)
    app.serve_lean(sqs.router.routes)
    rules = Rules(route for router in routers for route in router.routes)
    if app.openapi_url is not None:
        rules.add("GET", app.openapi_url, Needs.parse(["any"]))
    guarding: dict[str, Any] = dict(
        rules=rules,
        keys=lambda: getattr(app.state, "keys", None),
        sessions=lambda: getattr(app.state, "sessions", None),
        limiter=limiter,
        allowed_hosts=settings.host_allow_list(),
        allowed_origins=settings.origins(),
        open_paths=_open_paths(settings),
        refuse=_refuse,
    )
    limiting: dict[str, Any] = dict(max_bytes=settings.request_limit())
    # Outside the guard and the size limit: their refusals get an id, a line and
    # a count too. The metrics exist once the app starts (lifespan).
    logging_: dict[str, Any] = dict(
        enabled=settings.access_log,
        observe=lambda *answered: app.state.metrics.observe(*answered),
    )
    app.add_middleware(Guard, **guarding)
    app.add_middleware(LimitBody, **limiting)
    app.add_middleware(AccessLog, **logging_)
    if settings.origins():
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.origins(),
            allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
            allow_headers=["authorization", "content-type", "x-request-id"],
            expose_headers=["x-request-id"],
            max_age=600,
        )
    else:
        # The same three, by the same methods, in one call (no CORS to add).
        app.front_lean(Front(
            access=AccessLog(_unused, **logging_),
            limit=LimitBody(_unused, **limiting),
            gate=Guard(_unused, **guarding),
        ))
    return app


async def _refresh_metrics_forever(metrics: Metrics, throughput: Throughput) -> None:
    """Each process's own figures into its metrics once a second: with several
    processes a scrape reads them from the shared files, and the lease advice's
    warnings reach the log without waiting for a scrape. The dashboard's
    sparklines sample the counters while someone watches."""
    while True:
        metrics.refresh_local()
        throughput.tick()
        await metrics.tidy()
        await asyncio.sleep(1.0)


def _open_paths(settings: Settings) -> frozenset[str]:
    """Paths served without an API key even when keys exist."""
    paths = {"/healthz", "/readyz", *docs.ASSET_PATHS}
    if settings.open_metrics:
        paths.add("/metrics")
    if settings.open_docs:
        paths.update({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
    return frozenset(paths)


async def _unused(scope: Scope, receive: Receive, send: Send) -> None:
    """The app a middleware object used only by its methods wraps (Front)."""
    raise AssertionError("a Front's middleware objects are not called as apps")


async def _refuse(scope: Scope, send: Send, error: LeaseqError) -> None:
    await problems.error_response(error)(scope, _empty_receive, send)


async def _load_keys(keyring: ReceiptKeyring, keys: KeyStore, settings: Settings) -> None:
    """Receipt keys, whether API keys exist, and the bootstrap key; retried
    until the database answers."""
    delay = 0.1
    while True:
        try:
            if not keyring.loaded:
                await keyring.start()
            await keys.refresh()
            await bootstrap_admin_key(keys, settings)
            return
        except (DatabaseUnavailable, DatabaseError) as exc:
            _log.warning("cannot load the keys yet (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def bootstrap_admin_key(keys: KeyStore, settings: Settings) -> None:
    """LEASEQ_ADMIN_KEY: an admin key a deployment starts with, created once. Its
    shape was checked with the settings; once revoked it stays revoked."""
    token = settings.bootstrap_admin_key()
    if not token:
        return
    key_id, _, secret = token.partition(".")
    created = await keys.create("bootstrap admin", ["admin:*"], key_id=key_id, secret=secret)
    if created is not None:
        _log.info("created the bootstrap admin key %s", key_id)
