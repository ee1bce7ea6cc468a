"""leaseq: a durable, lease-based message queue on PostgreSQL with SQS semantics."""

__version__ = "0.1.0"
