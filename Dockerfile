# leaseq: the HTTP service, run against an external PostgreSQL (DATABASE_URL).
#
#   docker build -t leaseq .
#   docker run -p 127.0.0.1:8000:8000 -e DATABASE_URL=postgresql://user:pass@host:5432/db \
#              -e LEASEQ_SECRET=$(openssl rand -hex 32) \
#              -e LEASEQ_ADMIN_KEY=<key id>.<secret> leaseq
#
# It listens on 0.0.0.0, so `leaseq serve` refuses to start without an API key
# (LEASEQ_ADMIN_KEY or LEASEQ_ADMIN_KEY_FILE bootstraps one) and without
# LEASEQ_SECRET; see docs/security.md.
#
# `leaseq serve` applies the Alembic migrations (`alembic upgrade head`) before
# it starts serving; `docker run ... leaseq migrate` applies them alone.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A plain (non-editable) install without the test extras. The wheel carries the
# migrations as the package `app._alembic` (see [tool.setuptools] in
# pyproject.toml), so the source tree is not needed at run time and is removed.
# README.m[d] is a glob so that the build works whether or not README.md exists.
# The dependencies first, in a layer of their own that a code change leaves
# cached: exactly the versions and hashes of requirements.lock (bash .ci/lock).
COPY requirements.lock /tmp/requirements.lock
RUN pip install --require-hashes --no-deps -r /tmp/requirements.lock \
    && rm /tmp/requirements.lock
# Then the code: the client package (clients/python, a dependency of the server,
# its LICENSE a link to ../../LICENSE copied beside it) and the server, with no
# dependency resolved again.
COPY pyproject.toml README.m[d] LICENSE /tmp/src/
COPY clients/python /tmp/src/clients/python
COPY app /tmp/src/app
COPY alembic /tmp/src/alembic
RUN pip install --no-deps /tmp/src/clients/python /tmp/src \
    && rm -rf /tmp/src

# An unprivileged user. The image has no embedded PostgreSQL (the `embedded`
# extra is not installed): it needs DATABASE_URL.
RUN groupadd --system --gid 10001 leaseq \
    && useradd --system --uid 10001 --gid leaseq --home-dir /var/lib/leaseq \
        --create-home --shell /usr/sbin/nologin leaseq
WORKDIR /var/lib/leaseq
USER 10001:10001

ENV LEASEQ_HOST=0.0.0.0 \
    LEASEQ_PORT=8000 \
    LEASEQ_DATA_DIR=/var/lib/leaseq
EXPOSE 8000

# No curl in the slim image: python's urllib raises (exit 1) on errors and non-2xx.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('LEASEQ_PORT', '8000'), timeout=4)"]

ENTRYPOINT ["leaseq"]
CMD ["serve"]
