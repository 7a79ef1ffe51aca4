# The delaywheel server image. `make build` builds it when a Docker engine
# answers; docker-compose-run-sample.yml runs it beside a Redis that keeps what
# it acknowledges. Our CI machines have no engine, so tests/test_container.py
# checks the pieces instead: the same two wheels installed into a fresh venv,
# and this file's CMD and HEALTHCHECK run against a real server.
#
# Two stages: the first builds the two wheels (delaywheel-client, then
# delaywheel) and installs them into a venv; the second copies only that venv,
# so the image holds no source tree, no wheels and no build tools.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY delaywheel ./delaywheel
COPY client ./client
# The wheels are named by file so that pip never looks for delaywheel or
# delaywheel-client on an index; the third-party dependencies come from PyPI.
# [fast] brings uvloop: about twice the round trips per second of asyncio.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ./client . \
    && python -m venv /opt/delaywheel \
    && /opt/delaywheel/bin/pip install --no-cache-dir \
        /wheels/delaywheel_client-*.whl "$(ls /wheels/delaywheel-*.whl)[fast]"

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/delaywheel /opt/delaywheel
# A numeric user, so that an orchestrator's "must not run as root" check can
# verify it without reading /etc/passwd. /data is its home and the SQLite
# default's directory.
RUN groupadd --system --gid 10001 delaywheel \
    && useradd --system --uid 10001 --gid delaywheel --home-dir /data --create-home \
        --shell /usr/sbin/nologin delaywheel
USER 10001:10001
WORKDIR /data
ENV PATH=/opt/delaywheel/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    DELAYWHEEL_STORE=sqlite:////data/delaywheel.db
# Without a store setting the server would expect Redis on 127.0.0.1, which a
# container rarely has; SQLite in /data makes a bare `docker run` work. Mount a
# volume on /data to keep it, or set DELAYWHEEL_STORE=redis://... as the
# compose sample does.

EXPOSE 3450
# --host 0.0.0.0: listen beyond the container's own loopback (the server's
# default is 127.0.0.1). Every other setting comes from DELAYWHEEL_* variables.
# Beyond loopback the server wants DELAYWHEEL_TOKEN (or, for an open port that
# is meant, DELAYWHEEL_INSECURE_NO_AUTH=1): without either it refuses to start.
CMD ["delaywheel", "serve", "--host", "0.0.0.0"]

# The CLI's ping, from inside the container. It sends DELAYWHEEL_TOKEN first
# when the variable is set (the server reads the same one), so a wrong token
# fails the check too. --timeout stays under the check's own, so a hung server
# is reported by the CLI rather than killed. The start period covers loading a
# large store (about 4 s per million tasks).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["delaywheel", "--server", "127.0.0.1:3450", "--timeout", "3s", "ping"]
