# pgpool batch host image. Build: `make image` (or `podman build --format docker .` /
# `docker build .`); run: `docker run -e PGPOOL_DSN=... -e PGPOOL_HANDLERS=... pgpool`.
# BASE: any image with python3 >= 3.11 (and its venv module) and useradd, used by both stages
# so the virtualenv's interpreter path is the same in both.
ARG BASE=docker.io/library/python:3.11-slim-bookworm

FROM ${BASE} AS build
WORKDIR /src
# The context is pyproject.toml, README.md, LICENSE, pgpool/ and, if `make wheels` made it,
# build/wheels/ (.dockerignore). With build/wheels/, pip installs from it alone: for hosts
# whose build containers cannot reach PyPI; without it, pip downloads from PyPI.
COPY . ./
# pgpool with the worker extra, not the embedded one (about 45 MB of PostgreSQL binaries):
# the image always uses a configured database (PGPOOL_EMBEDDED=0 below).
# pip and setuptools end uninstalled: nothing in the runtime image builds or installs packages.
RUN set -e; \
    pgpool=.; \
    if [ -d build/wheels ]; then set -- --no-index --find-links build/wheels; pgpool=pgpool; fi; \
    python3 -m venv /opt/pgpool; \
    /opt/pgpool/bin/pip install --no-cache-dir --disable-pip-version-check "$@" "$pgpool[worker]"; \
    /opt/pgpool/bin/pip uninstall --yes --quiet pip setuptools

FROM ${BASE}
# A fixed numeric uid, so Kubernetes' runAsNonRoot can check it without a passwd lookup.
RUN groupadd --system --gid 10001 pgpool \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /app \
        --shell /usr/sbin/nologin pgpool \
 && mkdir -p /app && chown pgpool:pgpool /app
COPY --from=build /opt/pgpool /opt/pgpool
# /app is the working directory, and pgpool imports handler modules from there first: mount
# a directory of handler modules at /app (or put it on PYTHONPATH) and name them in
# PGPOOL_HANDLERS; or derive an image that installs a package with a pgpool.handlers entry
# point. PGPOOL_EMBEDDED=0: a missing PGPOOL_DSN is a one-line error, never a private
# database. The metrics port serves /healthz for the HEALTHCHECK (and /metrics).
ENV PATH=/opt/pgpool/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PGPOOL_EMBEDDED=0 \
    PGPOOL_METRICS_PORT=9187
WORKDIR /app
USER 10001:10001
EXPOSE 9187
# pgpool as PID 1 keeps a small init there (reaps orphans, forwards signals) and drains on
# SIGTERM: running jobs get PGPOOL_GRACE seconds (default 30) to finish. Give the runtime a
# stop timeout above that (docker stop -t / terminationGracePeriodSeconds: grace + 15).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=6s --start-period=30s --retries=3 CMD ["pgpool", "health"]
ENTRYPOINT ["pgpool"]
CMD ["run"]
