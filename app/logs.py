"""Log lines: one format for leaseq's own loggers and uvicorn's, JSON lines unless
a person is reading a terminal."""

from __future__ import annotations

import logging.config
import sys
from typing import Any

from app.config import Settings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_format(settings: Settings) -> str:
    """`json` or `text`: as configured, else text on a terminal only."""
    if settings.log_format is not None:
        return settings.log_format
    return "text" if sys.stderr.isatty() else "json"


def logging_config(settings: Settings) -> dict[str, Any]:
    """A dictConfig for every logger of the process. uvicorn takes it as its
    `log_config` and applies it in each worker process too, so a line has one
    shape whoever writes it."""
    level = settings.log_level.upper()
    if log_format(settings) == "json":
        formatter: dict[str, Any] = {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "{levelname}{name}{message}",
            "style": "{",
            "rename_fields": {"levelname": "level", "name": "logger"},
            "timestamp": "time",  # ISO 8601 in UTC, to the microsecond
        }
    else:
        formatter = {"format": TEXT_FORMAT}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"leaseq": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "leaseq",
                "stream": "ext://sys.stderr",
            },
        },
        # uvicorn's loggers write through the root's handler; its access log is
        # off (leaseq.access writes one line per request instead: app/asgi/access.py).
        "loggers": {
            "uvicorn": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.error": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},
        },
        "root": {"level": level, "handlers": ["stderr"]},
    }


def configure(settings: Settings) -> None:
    logging.config.dictConfig(logging_config(settings))
