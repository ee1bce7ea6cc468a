"""Imported by `leaseq worker` in a test: writes the modules loaded so far to the
file named by LEASEQ_TEST_MODULES (the worker then fails to find `missing`)."""

import json
import os
import sys

with open(os.environ["LEASEQ_TEST_MODULES"], "w") as out:
    json.dump(sorted(sys.modules), out)
