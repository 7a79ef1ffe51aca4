"""Client library for the delaywheel delay-queue server.

Quick start::

    from delaywheel_client import Client, Worker

    dw = Client("127.0.0.1", 3450)        # or Client.from_url("delaywheel://TOKEN@host:3450")
    dw.add("orders", {"order": 42}, delay=1800, id="close-order-42")  # due in 30 min

    worker = Worker(dw)

    @worker.handler("orders")
    def close_order(task: dict) -> None:  # return: acked; raise: retried with backoff
        print("closing", task["body"]["order"])

    worker.run()                          # until Ctrl-C / SIGTERM

``AsyncClient`` (``await AsyncClient.connect(...)``) has the same methods as coroutines;
``ClusterClient(["host1:3450", "host2:3450"])`` is ``Client`` for several nodes
(docs/protocol.md, "Several nodes"); ``Client.pipeline()`` batches many calls into one
write. Errors are in ``errors``: one class per protocol error code under
``DelaywheelError``. ``targets`` builds the maps ``target=`` takes, to deliver a due task
somewhere other than its topic's ready queue::

    from delaywheel_client import targets

    dw.add("invoices", {"invoice": 7}, delay=3600,
           target=targets.http("https://billing.example.com/hooks/due"))
    dw.add("emails", {"to": "a@example.com"}, target=targets.redis_list("emails"))

(``http``, ``redis_list``, ``redis_stream``, ``amqp``, ``nats``, and ``QUEUE``, the default.)
"""

from delaywheel_client import targets
from delaywheel_client.aio import AsyncClient, AsyncPipeline
from delaywheel_client.aio_cluster import AsyncClusterClient, AsyncClusterPipeline
from delaywheel_client.client import Client, Pipeline
from delaywheel_client.cluster import ClusterClient, ClusterPipeline
from delaywheel_client.errors import (
    BadRequest,
    Conflict,
    ConnectionFailed,
    DelaywheelError,
    Exists,
    Internal,
    NoMethod,
    NotFound,
    ServerClosed,
    TooLarge,
    Unauthorized,
    Unavailable,
    error_from,
)
from delaywheel_client.worker import Worker

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncClusterClient",
    "AsyncClusterPipeline",
    "AsyncPipeline",
    "BadRequest",
    "Client",
    "ClusterClient",
    "ClusterPipeline",
    "Conflict",
    "ConnectionFailed",
    "DelaywheelError",
    "Exists",
    "Internal",
    "NoMethod",
    "NotFound",
    "Pipeline",
    "ServerClosed",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "Worker",
    "__version__",
    "error_from",
    "targets",
]
