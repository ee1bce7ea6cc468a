"""`leaseq queues ...` and `leaseq top` (clients/python/leaseq/operate.py, top.py)
against a real service process on real PostgreSQL: their answers, exit statuses and
problem codes; the progress bar and the live view read from a pseudo-terminal, and
their plain output when piped."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from processes import LEASEQ, Service, ServiceProcesses, free_port, service_env, wait_until

from leaseq import Client

pytestmark = pytest.mark.e2e

ADMIN = "LQOPERATORADMIN0001.operator-secret-0123456789abcdef"
ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
COLOUR = re.compile(r"\x1b\[[0-9;]*(3[0-7]|9[0-7]|38;[0-9;]+)m")


@pytest.fixture
def service(tmp_path: Path, database_url: str) -> Iterator[Service]:
    with ServiceProcesses(tmp_path) as services:
        started = services.start(tmp_path / "data", database_url=database_url,
                                 env={"LEASEQ_ADMIN_KEY": ADMIN})
        started.wait_healthy()
        yield started


def _env(**more: str) -> dict[str, str]:
    env = service_env()
    for forcing in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(forcing, None)
    env.update(COLUMNS="120", LINES="40", TERM="xterm-256color", **more)
    return env


def _cli(service: Service, *args: str, key: str | None = ADMIN, stdin: str | None = None,
         **env: str) -> subprocess.CompletedProcess[str]:
    # The key in the environment, as operators are told to pass it (--api-key warns).
    if key is not None:
        env = {"LEASEQ_API_KEY": key, **env}
    return subprocess.run([LEASEQ, *args, "--url", service.url], env=_env(**env),
                          input=stdin, stdin=subprocess.DEVNULL if stdin is None else None,
                          capture_output=True, text=True, timeout=60, check=False)


_SIGINT_DEFAULT = [
    sys.executable, "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])",
]


class Terminal:
    """A command on a pseudo-terminal: what it wrote, read as it comes."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.master, replica = pty.openpty()
        # Ctrl-C's SIGINT as a terminal's foreground job has it: a test run in the
        # background of a shell without job control inherits it ignored, and
        # Python then never raises KeyboardInterrupt. The default survives exec.
        self.proc = subprocess.Popen([*_SIGINT_DEFAULT, *args], env=env, stdin=replica,
                                     stdout=replica, stderr=replica, start_new_session=True)
        os.close(replica)
        self.output = ""

    def read(self) -> str:
        while select.select([self.master], [], [], 0.05)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the other side closed: the process ended
                break
            if not chunk:
                break
            self.output += chunk.decode(errors="replace")
        return self.output

    def wait_for(self, seen: Callable[[str], bool], what: str, timeout: float = 30) -> None:
        try:
            wait_until(lambda: seen(self.read()), timeout=timeout, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the terminal shows {self.output[-600:]!r}") from None

    def finish(self, timeout: float = 30) -> int:
        """Its exit code, reading what it writes meanwhile: a command blocked
        writing to a full terminal would never end. Killed if it does not."""
        deadline = time.monotonic() + timeout
        while (code := self.proc.poll()) is None:
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                os.close(self.master)
                raise AssertionError(
                    f"still running after {timeout} s; the terminal shows "
                    f"{self.output[-600:]!r}")
            self.read()
        self.read()
        os.close(self.master)
        return code

    def interrupt(self) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.finish()


def test_the_queue_commands_answer_as_the_api_does(service: Service) -> None:
    made = _cli(service, "queues", "create", "jobs", "--visibility-timeout", "45")
    assert made.returncode == 0, made.stderr
    refused = _cli(service, "queues", "list", key=None)
    assert refused.returncode == 1 and "unauthenticated (401)" in refused.stderr
    missing = _cli(service, "queues", "show", "nope", "--json")
    assert missing.returncode == 1
    assert '"code": "queue_not_found"' in missing.stderr and '"status": 404' in missing.stderr
    unreachable = subprocess.run(
        [LEASEQ, "queues", "list", "--url", f"http://127.0.0.1:{free_port()}"],
        env=_env(), capture_output=True, text=True, timeout=60, check=False)
    assert unreachable.returncode == 3 and "unreachable" in unreachable.stderr
    unusable = _cli(service, "queues", "update", "jobs")
    assert unusable.returncode == 2 and "at least one attribute" in unusable.stderr

    shown = _cli(service, "queues", "show", "jobs", "--json")
    assert '"visibility_timeout": 45' in shown.stdout
    assert _cli(service, "queues", "update", "jobs", "--delay", "0",
                "--max-receive-count", "3", "--dead-letter-queue", "jobs-dlq").returncode == 1
    assert _cli(service, "queues", "create", "jobs-dlq").returncode == 0
    assert _cli(service, "queues", "update", "jobs", "--dead-letter-queue", "jobs-dlq",
                "--max-receive-count", "3").returncode == 0

    # The API refuses C0 controls but for tab and line breaks; DEL and the C1
    # controls (U+009B is a one-character CSI) and bidi overrides get through.
    hostile = "\u009b2J\x7fred\nline\tx\u202e"
    for body in ("one", "two"):
        assert _cli(service, "queues", "send", "jobs", body).returncode == 0
    sent = _cli(service, "queues", "send", "jobs", "-", "--attribute", "kind=evil",
                stdin=hostile)
    assert sent.returncode == 0 and re.fullmatch(r"[0-9a-f-]{36}\n", sent.stdout)

    listed = _cli(service, "queues", "list")  # piped: a plain table, no escapes
    assert listed.returncode == 0 and not ESCAPE.search(listed.stdout)
    line = next(row for row in listed.stdout.splitlines() if row.strip().startswith("jobs "))
    assert line.split()[:4] == ["jobs", "standard", "3", "0"]
    peeked = _cli(service, "queues", "peek", "jobs")
    assert not re.search("[\x7f-\x9f\u202e]", peeked.stdout)
    assert "\\x9b2J\\x7fred\\nline\\tx\\u202e" in peeked.stdout, peeked.stdout

    # Destructive commands ask first; with no terminal to ask on, they want --yes.
    unasked = _cli(service, "queues", "purge", "jobs")
    assert unasked.returncode == 2 and "--yes" in unasked.stderr
    with Client(service.url, api_key=ADMIN) as api:
        stats = api.get_queue("jobs").stats
        assert stats is not None and stats.visible == 3
    declined = Terminal([LEASEQ, "queues", "purge", "jobs", "--url", service.url],
                        _env(LEASEQ_API_KEY=ADMIN))
    declined.wait_for(lambda out: "[y/N]" in out, "the question")
    os.write(declined.master, b"n\n")
    assert declined.finish() == 1 and "nothing done" in declined.output
    purged = _cli(service, "queues", "purge", "jobs", "--yes")
    assert purged.returncode == 0 and purged.stdout == "purged 3 message(s)\n"
    assert _cli(service, "queues", "delete", "jobs", "--yes").returncode == 0
    gone = _cli(service, "queues", "show", "jobs")
    assert gone.returncode == 1 and "queue_not_found (404)" in gone.stderr


def _dead_letters(service: Service, count: int) -> None:
    """`count` messages in dlq, dead-lettered from work."""
    with Client(service.url, api_key=ADMIN) as api:
        api.create_queue("dlq")
        api.create_queue("work", dead_letter_queue="dlq", max_receive_count=1)
        for first in range(0, count, 10):  # the service's batch limit
            api.send_batch("work", [f"m{i}" for i in range(first, min(first + 10, count))])
    _drain_to_dlq(service, count)


def _drain_to_dlq(service: Service, count: int) -> None:
    """Receives from work with no lease until dlq holds `count`: a message's
    first claim delivers it, its next moves it (max_receive_count 1)."""
    with Client(service.url, api_key=ADMIN) as api:
        def all_moved() -> bool:
            api.receive("work", max=10, visibility_timeout=0)
            stats = api.get_queue("dlq").stats
            return stats is not None and stats.visible == count

        wait_until(all_moved, timeout=60, what=f"{count} messages in dlq")


def test_redrive_shows_its_progress_and_ctrl_c_leaves_it_running(service: Service) -> None:
    _dead_letters(service, 40)
    # On a terminal: a progress bar, then the task's end.
    shown = Terminal([LEASEQ, "queues", "redrive", "dlq", "--rate", "20", "--url",
                      service.url], _env(LEASEQ_API_KEY=ADMIN))
    assert shown.finish(timeout=60) == 0, shown.output
    assert "━" in shown.output and "40/40" in shown.output, shown.output
    assert re.search(r"redrive \S+ completed: moved 40", shown.output)

    _drain_to_dlq(service, 40)
    followed = Terminal([LEASEQ, "queues", "redrive", "dlq", "--rate", "2", "--url",
                         service.url], _env(LEASEQ_API_KEY=ADMIN))
    followed.wait_for(lambda out: "/40" in out, "the progress bar")
    assert followed.interrupt() == 130
    task_id = re.search(r"cancel-redrive (\S+)", followed.output)
    assert task_id is not None, followed.output
    with Client(service.url, api_key=ADMIN) as api:
        assert api.get_redrive(task_id[1]).status == "running"
    cancelled = _cli(service, "queues", "cancel-redrive", task_id[1])
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout

    # Piped: no bar, no escapes; the task's end on the last line.
    piped = _cli(service, "queues", "redrive", "dlq")
    assert piped.returncode == 0 and not ESCAPE.search(piped.stdout)
    assert re.search(r"redrive \S+ completed: moved \d+\n$", piped.stdout), piped.stdout


def test_top_refreshes_in_place_and_prints_plainly_when_piped(service: Service) -> None:
    _dead_letters(service, 3)
    live = Terminal([LEASEQ, "top", "--interval", "0.3", "--url", service.url],
                    _env(LEASEQ_API_KEY=ADMIN))
    # Two frames, the second drawn over the first (the cursor moved up).
    live.wait_for(lambda out: out.count("leaseq top") >= 2, "two refreshes")
    assert "\x1b[1A" in live.output or "\x1b[A" in live.output or "\x1b[2K" in live.output
    assert COLOUR.search(live.output), "dead-lettered messages are shown in colour"
    assert live.interrupt() == 130
    frame = ESCAPE.sub("", live.output)
    work = next(line for line in frame.splitlines() if line.strip().startswith("work "))
    assert work.split()[1:4] == ["0", "0", "0"] and work.split()[5] == "3", work

    quiet = Terminal([LEASEQ, "top", "--once", "--url", service.url],
                     _env(NO_COLOR="1", LEASEQ_API_KEY=ADMIN))
    assert quiet.finish() == 0 and "work" in quiet.output
    assert not COLOUR.search(quiet.output), "NO_COLOR: no colour"

    piped = _cli(service, "top", "--once")
    assert piped.returncode == 0 and not ESCAPE.search(piped.stdout)
    assert re.search(r"^\s*dlq\s+3\s+0\s+0\s", piped.stdout, re.MULTILINE), piped.stdout


def test_help_imports_neither_httpx_nor_rich() -> None:
    # `leaseq --help` stays fast (docs/operating.md gives the time measured): the
    # client (httpx) and the tables (rich) are imported by the commands that use them.
    probe = ("import sys\nfrom leaseq.cli import main\n"
             "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'httpx', 'rich'}),"
             " file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stderr.strip() == "[]", done.stderr
    for command in ("queues", "top", "doctor", "worker", "serve", "keys"):
        assert command in done.stdout
