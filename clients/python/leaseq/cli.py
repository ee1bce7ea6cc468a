"""The `leaseq` command of the client package: `leaseq worker`, `leaseq queues`
and `leaseq top` (an operator's commands, leaseq/operate.py and leaseq/top.py), and
every other command handed to the server's CLI when the server (distribution
`leaseq`) is installed beside it.

`leaseq worker` imports nothing but this package and httpx, so a project whose
own code lives in a package called `app` runs `leaseq worker app.tasks:handle`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leaseq import operate, top

if TYPE_CHECKING:
    from leaseq.backoff import Backoff

SERVER_COMMANDS = "leaseq.commands"
"""The entry-point group the server registers its CLI under (`server`)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leaseq", description="A durable lease-based message queue on PostgreSQL."
    )
    commands = parser.add_subparsers(dest="command")
    _worker_parser(commands)
    operate.add_parser(commands)
    top.add_parser(commands)
    return parser


def _worker_parser(commands: Any) -> None:
    worker = commands.add_parser(
        "worker",
        help="run a handler for the messages of a queue (see docs/workers.md)",
        description="Receive messages from a leaseq service and run HANDLER (module:function, "
        "a sync or async function taking (message, ctx)) for each, with heartbeats and a "
        "watchdog that cancels the handler when its lease is lost. SIGTERM or SIGINT stops "
        "receiving and lets in-flight handlers finish within the grace period.",
    )
    worker.add_argument("handler", metavar="module:function", help="the handler to run")
    worker.add_argument("--queue", required=True, help="queue to receive from")
    worker.add_argument("--concurrency", type=int, default=1, help="handlers at once (1)")
    worker.add_argument(
        "--url", help="the service (LEASEQ_URL, default http://127.0.0.1:8000)"
    )
    operate.add_key_options(worker)
    worker.add_argument(
        "--visibility-timeout", "--lease", type=int, dest="visibility_timeout",
        help="seconds per lease and per extension (default: the queue's visibility timeout)",
    )
    worker.add_argument(
        "--heartbeat-period", type=float, help="seconds between heartbeats (lease / 3)"
    )
    worker.add_argument(
        "--heartbeat", choices=["auto", "task", "thread"], default="auto",
        help="where heartbeats run: an asyncio task, or a thread of their own "
        "(auto: task for async handlers, thread for sync ones)",
    )
    worker.add_argument("--wait", type=int, default=20, help="long-poll seconds, 0-20 (20)")
    worker.add_argument(
        "--grace", type=float, default=30.0, help="seconds in-flight handlers get at shutdown"
    )
    retries = worker.add_argument_group(
        "retries",
        "Without these options a failed message is released with no delay of the "
        "worker's: the queue's retry ladder (its retry_backoff attribute) decides, and "
        "on a queue without one the message is retried at once. --retry-delay gives the "
        "worker a backoff of its own, whose delay overrides the queue's ladder.",
    )
    retries.add_argument(
        "--retry-delay", type=float,
        help="seconds before a failed message is retried, first time (0: at once)",
    )
    retries.add_argument(
        "--retry-multiplier", type=float,
        help="growth of the retry delay per attempt (2; needs --retry-delay)",
    )
    retries.add_argument(
        "--retry-max", type=float, help="longest retry delay (900; needs --retry-delay)"
    )
    retries.add_argument(
        "--retry-jitter", type=float,
        help="spread of the retry delay, a fraction (0.2; needs --retry-delay)",
    )
    worker.add_argument(
        "--app-dir", default=".", help="directory put first on sys.path to import from (.)"
    )
    worker.add_argument(
        "--log-level", default=os.environ.get("LEASEQ_LOG_LEVEL", "info"), help="log level"
    )


def _server() -> Callable[[list[str]], int] | None:
    """The server's CLI, when the server is installed."""
    for entry in entry_points(group=SERVER_COMMANDS, name="server"):
        command: Callable[[list[str]], int] = entry.load()
        return command
    return None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["worker"]:
        return _worker(_parser().parse_args(args))
    if args[:1] == ["queues"]:
        return operate.run(_parser().parse_args(args))
    if args[:1] == ["top"]:
        return top.run(_parser().parse_args(args))
    server = _server()
    if server is not None:
        return server(args)
    if args[:1] in ([], ["-h"], ["--help"]):
        _parser().print_help()
        print("\nserve, migrate, keys and doctor come with the server: pip install leaseq")
        return 0
    print(f"leaseq: {args[0]!r} needs the server (pip install leaseq); this package "
          "has `leaseq worker`, `leaseq queues` and `leaseq top`", file=sys.stderr)
    return 2


def load_handler(spec: str, app_dir: str = ".") -> Callable[..., Any]:
    """`module:function` (the function may be a dotted attribute path), imported
    with `app_dir` first on sys.path."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{spec!r} is not module:function")
    path = str(Path(app_dir).resolve())
    if path not in sys.path:
        sys.path.insert(0, path)
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{spec} is not callable")
    handler: Callable[..., Any] = target
    return handler


def worker_backoff(args: argparse.Namespace) -> Backoff | None:
    """The worker's own backoff from the --retry-* options; None (the queue's retry
    ladder decides) without --retry-delay. ValueError for options that do not fit."""
    from leaseq.backoff import Backoff

    if args.retry_delay is None:
        given = [
            f"--retry-{name}" for name in ("multiplier", "max", "jitter")
            if getattr(args, f"retry_{name}") is not None
        ]
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise ValueError(f"{', '.join(given)} {verb} --retry-delay")
        return None
    options: dict[str, float] = {"initial": args.retry_delay}
    for name, field in (("multiplier", "multiplier"), ("max", "maximum"), ("jitter", "jitter")):
        value = getattr(args, f"retry_{name}")
        if value is not None:
            options[field] = value
    return Backoff(**options)


def _worker(args: argparse.Namespace) -> int:
    from leaseq.errors import ClientError
    from leaseq.worker import Worker

    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    key, failed = operate.keyed("leaseq worker", args)
    if failed is not None:
        return failed
    try:
        handler = load_handler(args.handler, args.app_dir)
    except (ImportError, AttributeError, ValueError) as exc:
        print(f"leaseq worker: cannot load {args.handler}: {exc}", file=sys.stderr)
        return 2
    try:
        worker = Worker(
            handler,
            queue=args.queue,
            url=args.url,
            concurrency=args.concurrency,
            visibility_timeout=args.visibility_timeout,
            heartbeat_period=args.heartbeat_period,
            heartbeat=args.heartbeat,
            wait=args.wait,
            grace=args.grace,
            backoff=worker_backoff(args),
            api_key=key,
        )
    except ValueError as exc:
        print(f"leaseq worker: {exc}", file=sys.stderr)
        return 2
    try:
        worker.run()
    except ClientError as exc:
        print(f"leaseq worker: {exc}", file=sys.stderr)
        return 1
    return 0
