"""The web dashboard (``--web-port``; docs/dashboard.md): pages, actions, live numbers.

An aiohttp site on the server's own loop, imported only when the port is
set. It reads the engine as ``stats`` and ``/metrics`` do, and changes tasks
only through the engine's validated, journaled verbs, answering once the
change is durable, as the protocol does.
"""
