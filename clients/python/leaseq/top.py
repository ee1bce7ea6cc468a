"""`leaseq top`: every queue's depth and rates, refreshed in place like `top`.

On a terminal the table is redrawn every --interval seconds until Ctrl-C; when the
output is not a terminal (a pipe, a file) one table is printed per refresh, or one
alone with --once. The figures are the dashboard's (`Client.overview`): visible,
in flight, delayed, oldest visible, messages in dead-letter queues, and sent and
acknowledged per second.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from leaseq.operate import OK, add_connection_options, positive_float

if TYPE_CHECKING:
    from rich.table import Table

    from leaseq.client import Client

COLUMNS = ["queue", "visible", "in flight", "delayed", "oldest", "dead-lettered",
           "sent/s", "acked/s"]


def add_parser(commands: Any) -> None:
    top = commands.add_parser(
        "top", help="every queue's depth and rates, refreshed in place",
        description="Every queue's visible, in flight, delayed and oldest visible "
        "messages, its messages in dead-letter queues, and sent and acknowledged per "
        "second, refreshed in place until Ctrl-C.",
    )
    add_connection_options(top)
    top.add_argument("--prefix", help="only queues whose name starts so")
    top.add_argument("--interval", type=positive_float, default=2.0,
                     help="seconds between refreshes (2)")
    top.add_argument("--once", action="store_true", help="print one table and exit")


def run(args: argparse.Namespace) -> int:
    from leaseq.client import Client
    from leaseq.operate import keyed, run_guarded

    def show(client: Client) -> int:
        return _show(client, args)

    key, failed = keyed("leaseq top", args)
    if failed is not None:
        return failed
    return run_guarded("leaseq top", args, Client(args.url, api_key=key), show)


def _show(client: Client, args: argparse.Namespace) -> int:
    from rich.live import Live
    from rich.text import Text

    from leaseq.errors import ClientError
    from leaseq.terminal import console, safe

    out = console()
    if args.once or not out.is_terminal:
        while True:
            out.print(snapshot(client, args.prefix))
            if args.once:
                return OK
            time.sleep(args.interval)
    # The first reading's failure ends the command (a wrong URL or key); later
    # ones are shown in the title and retried (a restarting service).
    shown = snapshot(client, args.prefix)
    with Live(shown, console=out, screen=False, auto_refresh=False) as live:
        while True:
            time.sleep(args.interval)
            try:
                shown = snapshot(client, args.prefix)
            except ClientError as exc:
                shown.title = Text(f"leaseq top  {_now()}  retrying: {safe(str(exc))[:80]}")
            live.update(shown, refresh=True)


def snapshot(client: Client, prefix: str | None) -> Table:
    from leaseq.terminal import age, alarming, table

    queues = client.overview(prefix)
    rows = [(q["name"], q["visible"], q["in_flight"], q["delayed"],
             age(q["oldest_visible_age_seconds"]),
             alarming(q["dead_lettered"]) if q["dead_letter_queue"] else None,
             _last(q["sent_per_second"]), _last(q["deleted_per_second"]))
            for q in queues]
    title = f"leaseq top  {_now()}  {len(rows)} queue(s)"
    return table(COLUMNS, rows, numeric=COLUMNS[1:], title=title)


def _now() -> str:
    return datetime.now().strftime("%H:%M:%S")


def _last(series: list[float]) -> float | None:
    return series[-1] if series else None
