"""`python -m app` is `leaseq`."""

from app.cli import main

raise SystemExit(main())
