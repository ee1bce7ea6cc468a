"""docs/security.md's authorization table is the declarations (app/auth/access.py)
written out: this test makes it from them and compares. To rewrite the table
after changing a declaration: `LEASEQ_WRITE_DOCS=1 pytest tests/auth/test_security_doc.py`."""

from __future__ import annotations

import os
from pathlib import Path

from app.api.routes import health, keys, messages, queues, redrive
from app.auth.access import Needs, needs_of_route
from app.sqs.actions import NEEDS
from app.ui import routes as ui

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
BEGIN = "<!-- authorization table: made by tests/auth/test_security_doc.py -->"
END = "<!-- end of the authorization table -->"

WHERE = {
    "queue": "the queue",
    "name": "the queue it names",
    "dead_letter_queue": "the dead-letter queue of a redrive policy it sets",
    "redrive_targets": "the destination, else each queue the messages return to",
    "task": "the task's dead-letter queue",
    "listed": "some queue (it shows only those)",
}


def _needs_text(needs: Needs) -> str:
    if needs.keys:
        return "`admin:*` (key management)"
    if needs.any_key:
        return "any valid key"
    return "; ".join(f"`{action}` on {WHERE[target]}" for action, target in needs.pairs)


def table() -> str:
    rows = ["| door | operation | needs |", "|---|---|---|"]
    for router in (messages.router, queues.router, redrive.router, keys.router,
                   health.router, ui.router):
        for route in router.routes:
            needs = needs_of_route(route)
            if needs is None:
                continue
            for method in sorted(route.methods):
                rows.append(f"| REST | `{method} {route.path}` | {_needs_text(needs)} |")
    for action, needs in NEEDS.items():
        rows.append(f"| SQS | `{action}` | {_needs_text(needs)} |")
    return "\n".join(rows)


def test_the_documented_table_is_the_declarations() -> None:
    text = DOC.read_text()
    assert BEGIN in text and END in text, "docs/security.md lost its table markers"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    current = f"{head}{BEGIN}\n{table()}\n{END}{tail}"
    if os.environ.get("LEASEQ_WRITE_DOCS"):
        DOC.write_text(current)
    assert text == current, "docs/security.md's authorization table is out of date " \
        "(LEASEQ_WRITE_DOCS=1 pytest tests/auth/test_security_doc.py rewrites it)"
