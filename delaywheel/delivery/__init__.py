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
- ``http``: the HTTP sender (one aiohttp session, bounded requests in flight).
- ``brokers``: Redis list and stream, RabbitMQ, NATS JetStream senders.
- ``targets``: a target map as a client sends it, checked at ``add``.
- ``dispatcher``: runs deliveries and reports their outcome to the engine.
"""
