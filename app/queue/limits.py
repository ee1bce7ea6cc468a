"""The documented limits of queues and messages (SQS's, unless noted)."""

from __future__ import annotations

import re

# A FIFO queue's name ends in ".fifo", and only a FIFO queue's (SQS's rule).
QUEUE_NAME = re.compile(r"^(?:[A-Za-z0-9_-]{1,80}|[A-Za-z0-9_-]{1,75}\.fifo)$")
FIFO_SUFFIX = ".fifo"
# Message group and deduplication ids (SQS): 1-128 letters, digits and punctuation.
FIFO_ID = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")
DEDUPLICATION_SECONDS = 300  # the window of a deduplication id and a receive attempt
DEDUPLICATION_SCOPES = ("queue", "message_group")
FIFO_THROUGHPUT_LIMITS = ("per_queue", "per_message_group_id")

VISIBILITY_TIMEOUT = (0, 43_200)  # seconds; 12 hours
MESSAGE_RETENTION = (60, 1_209_600)  # seconds; 1 minute .. 14 days
DELAY = (0, 900)  # seconds
RECEIVE_WAIT = (0, 20)  # seconds
MAX_MESSAGE_BYTES = (1_024, 1_048_576)
RECEIVE_MAX = (1, 10)
MAX_RECEIVE_COUNT = (1, 1_000)  # redrive policy
RETRY_SECONDS = (0, 43_200)  # retry ladder: initial and max delay
RETRY_MULTIPLIER = (1, 100)
RETRY_JITTER = (0, 1)
RELEASE_DELAY = (0, 43_200)
# Fair queues: a noisy tenant's share (a fraction above 0) and least messages in flight.
FAIR_SHARE = (0.0, 1.0)
FAIR_IN_FLIGHT_MIN = (1, 120_000)  # SQS's in-flight limit of a queue

DEFAULTS: dict[str, int] = {
    "visibility_timeout": 30,
    "message_retention": 4 * 24 * 3600,
    "delay": 0,
    "receive_wait": 0,
    "max_message_bytes": 1_048_576,
}

MAX_ATTRIBUTES = 10  # per message, as SQS
MAX_TAGS = 50  # per queue, as SQS
TAG_KEY_CHARS = 128
TAG_VALUE_CHARS = 256
ATTRIBUTE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,256}$")
# The characters SQS accepts in text (XML 1.0's Char): no NUL or other C0
# control but tab, newline and return, no lone surrogate. PostgreSQL's text and
# jsonb refuse NUL and lone surrogates as well.
NOT_TEXT_CHAR = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# Entries of one REST batch: the top of LEASEQ_MAX_BATCH's range (app/config.py).
MAX_BATCH = 1_000


def is_queue_name(name: str) -> bool:
    return QUEUE_NAME.fullmatch(name) is not None
