"""Delivery of due tasks to targets other than the ready queue.

A task with an HTTP or broker target never joins a ready queue: when it is
due, the engine journals the attempt (state ``delivering``, ``attempts``
counted) and, once that record is durable, hands a ``Delivery`` to the
dispatcher, which runs it beside the tick and the request handling. The
outcome comes back to the engine as one more journaled change: the task is
removed (delivered), or goes back to ``delayed`` at its next try, or to
``dead`` after ``max_attempts``.

- ``base``: what a delivery is and what a sender does.
- ``body``: the task body as an HTTP request, AMQP message or NATS message carries it.
- ``allow``: ``--http-allow``, the destinations the server may call.
- ``targets``: a target map as a client sends it, checked at ``add``
  (``http_target`` for HTTP, ``brokers`` for the rest).
- ``http``: the HTTP sender (one aiohttp session, its resolver in ``_resolver``).
- ``brokers``: the named brokers and their senders (Redis list and stream,
  RabbitMQ, NATS JetStream; ``_*_broker``).
- ``dispatcher``: runs deliveries in lanes, one per destination, and reports
  their outcome to the engine (``Engine.delivered``).
- ``service``: a server's senders and dispatcher, started and stopped together.

What checks targets (the engine, the CLI) never imports aiohttp, aio-pika or
nats-py; the senders import them when the server first needs one.
"""
