"""Handlers the worker tests run, in `leaseq worker` processes or in-process."""
