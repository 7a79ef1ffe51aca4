# delaywheel server image. Not built in CI (no Docker engine on our CI
# machines); the same install is exercised by `make build` and the tests.
FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY delaywheel ./delaywheel
COPY client ./client
# [fast] brings uvloop: about twice the round trips per second of asyncio.
RUN pip install --no-cache-dir '.[fast]' && useradd --system --home /data delaywheel \
    && mkdir -p /data && chown delaywheel /data

USER delaywheel
WORKDIR /data
EXPOSE 3450
# Listen beyond the container's loopback; the store comes from DELAYWHEEL_STORE
# (the default is Redis on 127.0.0.1, which a container rarely has).
ENV DELAYWHEEL_HOST=0.0.0.0 \
    DELAYWHEEL_STORE=sqlite:////data/delaywheel.db
CMD ["delaywheel", "serve"]
