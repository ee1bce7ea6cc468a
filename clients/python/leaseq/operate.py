"""`leaseq queues ...`: an operator's commands against a running service, over its
REST API with a key (docs/operating.md, "From a terminal"). Only this package and
httpx (and rich, for the tables) are needed: a laptop can operate a remote leaseq.

Exit status: 0 done; 1 the service refused (its problem `code` is printed) or the
operator declined; 2 a usage error; 3 the service could not be reached; 130
interrupted.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leaseq.client import Client
    from leaseq.models import RedriveTask

OK, REFUSED, USAGE, UNREACHABLE, INTERRUPTED = 0, 1, 2, 3, 130


class UsageError(Exception):
    """A command asked for something it cannot do as given (exit status 2)."""


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value

_ATTRIBUTES = (
    # option, attribute, type, help
    ("--visibility-timeout", "visibility_timeout", int, "seconds a receive leases"),
    ("--retention", "message_retention", int, "seconds a message is kept"),
    ("--delay", "delay", int, "seconds before a sent message is visible"),
    ("--receive-wait", "receive_wait", int, "default long-poll seconds"),
    ("--max-message-bytes", "max_message_bytes", int, "largest body"),
    ("--dead-letter-queue", "dead_letter_queue", str, "where exhausted messages go"),
    ("--max-receive-count", "max_receive_count", int, "receives before dead-lettering"),
)


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="the service (LEASEQ_URL, default http://127.0.0.1:8000)")
    add_key_options(parser)


def add_key_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--key-file", metavar="PATH",
        help="a file holding the <key id>.<secret> the service requires (or set LEASEQ_API_KEY)",
    )
    parser.add_argument(
        "--api-key", help="<key id>.<secret>; every user of this machine sees it in `ps`: "
        "prefer LEASEQ_API_KEY or --key-file",
    )


def api_key(command: str, args: argparse.Namespace) -> str | None:
    """The key of --key-file, else of --api-key (with a warning: a command line is
    anyone's to read), else None: the client then reads LEASEQ_API_KEY.
    UsageError for a file that gives no key."""
    if args.key_file is not None:
        if args.api_key is not None:
            raise UsageError("give --key-file or --api-key, not both")
        try:
            text = Path(args.key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--key-file {args.key_file} cannot be read: {exc}") from None
        if not text:
            raise UsageError(f"--key-file {args.key_file} is empty")
        return text
    if args.api_key is not None:
        print(f"{command}: warning: a key given with --api-key is visible to every user of "
              "this machine (ps, /proc); use LEASEQ_API_KEY or --key-file", file=sys.stderr)
    return str(args.api_key) if args.api_key is not None else None


def keyed(command: str, args: argparse.Namespace) -> tuple[str | None, int | None]:
    """(the key, None), or (None, USAGE) once the usage error is printed."""
    try:
        return api_key(command, args), None
    except UsageError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return None, USAGE


def add_parser(commands: Any) -> None:
    queues = commands.add_parser(
        "queues", help="list, show, create, change, purge, peek at and redrive queues",
        description="Operate a leaseq service's queues over its API, with a key. "
        "Exit status: 0 done, 1 refused by the service (its problem code printed) or "
        "declined, 2 usage, 3 service unreachable.",
    )
    actions = queues.add_subparsers(dest="queues_command", required=True, metavar="ACTION")

    def action(name: str, text: str, *, json_output: bool = True) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(name, help=text, description=text)
        add_connection_options(parser)
        if json_output:
            parser.add_argument("--json", action="store_true", help="JSON, for scripts")
        return parser

    listing = action("list", "the queues, with their depth and oldest message")
    listing.add_argument("--prefix", help="only queues whose name starts so")
    action("show", "a queue's attributes and figures").add_argument("queue")
    for name, text in (("create", "create a queue"), ("update", "change a queue's attributes")):
        parser = action(name, text)
        parser.add_argument("queue")
        for option, attribute, kind, help_text in _ATTRIBUTES:
            parser.add_argument(option, dest=attribute, type=kind, help=help_text)
        if name == "create":
            parser.add_argument("--fifo", action="store_true",
                                help="a FIFO queue (its name ends in .fifo)")
    for name, text in (("delete", "delete a queue and its messages"),
                       ("purge", "delete every message of a queue")):
        parser = action(name, text)
        parser.add_argument("queue")
        parser.add_argument("--yes", "-y", action="store_true", help="do not ask first")
    peek = action("peek", "messages of a queue, without claiming them")
    peek.add_argument("queue")
    peek.add_argument("--state", choices=["visible", "in_flight", "delayed"])
    peek.add_argument("--limit", type=positive_int, default=20, help="messages (20)")
    send = action("send", "send a message")
    send.add_argument("queue")
    send.add_argument("body", help="the body; - reads it from standard input")
    send.add_argument("--delay", type=int)
    send.add_argument("--group", help="message group (FIFO queues)")
    send.add_argument("--deduplication-id")
    send.add_argument("--attribute", action="append", default=[], metavar="NAME=VALUE")
    redrive = action("redrive", "move a dead-letter queue's messages back, and follow it")
    redrive.add_argument("queue", help="the dead-letter queue")
    redrive.add_argument("--to", dest="destination",
                         help="one queue for all (default: each message's source)")
    redrive.add_argument("--rate", type=positive_int, help="messages a second at most")
    redrive.add_argument("--no-follow", action="store_true",
                         help="start the task and return its id at once")
    cancel = action("cancel-redrive", "stop a redrive task (what it moved stays moved)")
    cancel.add_argument("task_id")


def run(args: argparse.Namespace) -> int:
    from leaseq.client import Client

    command = f"leaseq queues {args.queues_command}"
    key, failed = keyed(command, args)
    if failed is not None:
        return failed
    return run_guarded(command, args, Client(args.url, api_key=key),
                       lambda client: _HANDLERS[args.queues_command](client, args))


def run_guarded(command: str, args: argparse.Namespace, client: Client,
                act: Callable[[Client], int]) -> int:
    """`act(client)`, its failures as the exit statuses above."""
    from leaseq.errors import ApiError, Unreachable

    try:
        with client:
            return act(client)
    except ApiError as exc:
        _problem(command, args, exc.status, exc.code, exc.detail)
        return REFUSED
    except Unreachable as exc:
        _problem(command, args, None, "unreachable", str(exc))
        return UNREACHABLE
    except UsageError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return USAGE
    except KeyboardInterrupt:
        return INTERRUPTED


def _problem(command: str, args: argparse.Namespace, status: int | None, code: str,
             detail: str) -> None:
    from leaseq.terminal import safe, to_json

    if getattr(args, "json", False):
        print(to_json({"status": status, "code": code, "detail": detail}), file=sys.stderr)
    else:
        # What a server (or a proxy before it) answered is shown, never obeyed.
        where = "" if status is None else f" ({status})"
        print(f"{command}: {safe(code)}{where}: {safe(detail)}", file=sys.stderr)


def _list(client: Client, args: argparse.Namespace) -> int:
    from leaseq.terminal import age, alarming, console, table, to_json

    queues = client.overview(args.prefix)
    if args.json:
        print(to_json(queues))
        return OK
    rows = [(q["name"], "fifo" if q["fifo"] else "standard", q["visible"], q["in_flight"],
             q["delayed"], age(q["oldest_visible_age_seconds"]),
             q["dead_letter_queue"],
             alarming(q["dead_lettered"]) if q["dead_letter_queue"] else None)
            for q in queues]
    console().print(table(
        ["queue", "kind", "visible", "in flight", "delayed", "oldest", "dead-letter queue",
         "dead-lettered"], rows,
        numeric=["visible", "in flight", "delayed", "oldest", "dead-lettered"]))
    return OK


def _show(client: Client, args: argparse.Namespace) -> int:
    from leaseq.terminal import age, console, safe, table, to_json

    queue = client.get_queue(args.queue)
    if args.json:
        print(to_json(queue))
        return OK
    rows: list[tuple[str, Any]] = [("name", queue.name), ("created", queue.created_at),
                                   ("updated", queue.updated_at)]
    rows += [(name.replace("_", " "), value)
             for name, value in vars(queue.attributes).items()]
    if queue.stats is not None:
        rows += [("visible", queue.stats.visible), ("in flight", queue.stats.in_flight),
                 ("delayed", queue.stats.delayed),
                 ("oldest visible", age(queue.stats.oldest_age_seconds))]
    console().print(table(["", safe(queue.name)], rows))
    return OK


def _attributes(args: argparse.Namespace) -> dict[str, Any]:
    given = {attribute: getattr(args, attribute) for _, attribute, _, _ in _ATTRIBUTES
             if getattr(args, attribute) is not None}
    if getattr(args, "fifo", False):
        given["fifo"] = True
    return given


def _create(client: Client, args: argparse.Namespace) -> int:
    return _print_queue(client.create_queue(args.queue, **_attributes(args)), args)


def _update(client: Client, args: argparse.Namespace) -> int:
    changes = _attributes(args)
    if not changes:
        raise UsageError("name at least one attribute to change (leaseq queues update -h)")
    return _print_queue(client.update_queue(args.queue, **changes), args)


def _print_queue(queue: Any, args: argparse.Namespace) -> int:
    from leaseq.terminal import to_json

    print(to_json(queue) if args.json else f"{queue.name}: {to_json(queue.attributes)}")
    return OK


def _delete(client: Client, args: argparse.Namespace) -> int:
    return _destructive(client, args, "Delete queue {queue} and every message in it?",
                        lambda: client.delete_queue(args.queue), "deleted {queue}")


def _purge(client: Client, args: argparse.Namespace) -> int:
    return _destructive(client, args, "Delete every message of {queue}?",
                        lambda: client.purge(args.queue), "purged {result} message(s)")


def _destructive(client: Client, args: argparse.Namespace, question: str,
                 act: Callable[[], Any], done: str) -> int:
    from leaseq.terminal import confirm, safe, to_json

    queue = client.get_queue(args.queue)  # a missing queue is refused before asking
    held = "" if queue.stats is None else (
        f" ({queue.stats.visible + queue.stats.in_flight + queue.stats.delayed} now)")
    if not args.yes and not sys.stdin.isatty():
        raise UsageError("standard input is not a terminal to ask on: add --yes")
    if not confirm(question.format(queue=safe(queue.name)) + held, yes=args.yes):
        print("nothing done", file=sys.stderr)
        return REFUSED
    result = act()
    if args.json:
        print(to_json({"queue": queue.name, "result": result}))
    else:
        print(done.format(queue=safe(queue.name), result=result))
    return OK


def _peek(client: Client, args: argparse.Namespace) -> int:
    from leaseq.terminal import console, safe, table, to_json

    page = client.peek(args.queue, state=args.state, limit=args.limit)
    if args.json:
        print(to_json(page))
        return OK
    out = console()
    # The body gets what the other columns (id 36, state, receives, sent, gaps:
    # about 78) leave of the terminal.
    width = max(out.width - 78, 20)
    rows = [(m.message_id, m.state, m.receive_count, m.sent_at.strftime("%Y-%m-%d %H:%M:%S"),
             safe(m.body, width) + (" …(cut)" if m.truncated else ""))
            for m in page.messages]
    out.print(table(["message id", "state", "receives", "sent", "body"], rows,
                    numeric=["receives"], whole=["message id"]))
    if page.next_after is not None:
        print(f"(more than {args.limit}: a larger --limit shows more)", file=sys.stderr)
    return OK


def _send(client: Client, args: argparse.Namespace) -> int:
    from leaseq.terminal import to_json

    body = sys.stdin.read() if args.body == "-" else args.body
    attributes = {}
    for item in args.attribute:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--attribute {item!r} is not NAME=VALUE")
        attributes[name] = value
    sent = client.send(args.queue, body, delay=args.delay, attributes=attributes or None,
                       group=args.group, deduplication_id=args.deduplication_id)
    print(to_json(sent) if args.json else sent.message_id)
    return OK


def _redrive(client: Client, args: argparse.Namespace) -> int:
    from leaseq.terminal import to_json

    task = client.start_redrive(args.queue, destination=args.destination,
                                max_per_second=args.rate)
    if args.no_follow:
        print(to_json(task) if args.json else task.task_id)
        return OK
    try:
        task = _follow(client, task, quiet=args.json)
    except KeyboardInterrupt:
        print(f"\nThe redrive goes on in the service. To stop it:\n"
              f"  leaseq queues cancel-redrive {task.task_id}", file=sys.stderr)
        return INTERRUPTED
    if args.json:
        print(to_json(task))
    return OK if task.status == "completed" else REFUSED


def _follow(client: Client, task: RedriveTask, *, quiet: bool) -> RedriveTask:
    """Polls the task until it ends, with a progress bar on a terminal (moved of
    all, rate, ETA); a line each poll when the output is not one."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )

    from leaseq.terminal import console, safe

    out = console(stderr=quiet)
    columns = (TextColumn("redrive {task.description}", markup=False), BarColumn(),
               MofNCompleteColumn(), TaskProgressColumn(),
               TextColumn("{task.fields[rate]}/s", markup=False), TimeRemainingColumn())
    with Progress(*columns, console=out, disable=not out.is_terminal) as progress:
        bar = progress.add_task(safe(task.source), total=task.moved + task.remaining,
                                completed=task.moved, rate="-")
        started, moved_at_start = time.monotonic(), task.moved
        while task.status == "running":
            time.sleep(0.5)
            task = client.get_redrive(task.task_id)
            rate = (task.moved - moved_at_start) / max(time.monotonic() - started, 1e-3)
            progress.update(bar, total=task.moved + task.remaining, completed=task.moved,
                            rate=f"{rate:,.0f}")
            if not out.is_terminal and not quiet:
                print(f"{task.status}: moved {task.moved}, remaining {task.remaining}",
                      flush=True)
    if not quiet:
        print(f"redrive {task.task_id} {task.status}: moved {task.moved}"
              + (f" ({safe(task.failure)})" if task.failure else ""))
    return task


def _cancel(client: Client, args: argparse.Namespace) -> int:
    from leaseq.terminal import to_json

    task = client.cancel_redrive(args.task_id)
    print(to_json(task) if args.json else f"redrive {task.task_id} {task.status}")
    return OK


_HANDLERS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "list": _list, "show": _show, "create": _create, "update": _update, "delete": _delete,
    "purge": _purge, "peek": _peek, "send": _send, "redrive": _redrive,
    "cancel-redrive": _cancel,
}
