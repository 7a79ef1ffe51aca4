"""The engine: task state and every change to it, with nothing of sockets.

``engine.Engine`` holds the request verbs; the modules beside it are what
it is made of: the task and its transition table (``task``), its store
record (``record``), request checks
(``validate``), the index and counts (``index``), the ready queues and
waiters (``queues``), cold tasks held packed and loading at start-up
(``cold``), delivery attempts (``attempts``), and the journal
that makes changes durable in group commits (``journal``).

This module imports none of them, so a caller that needs one (the CLI's
settings need ``validate``) does not load the rest.
"""
