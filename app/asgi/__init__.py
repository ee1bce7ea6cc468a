"""ASGI helpers both front doors share (REST and SQS import nothing of each other)."""
