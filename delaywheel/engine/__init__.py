"""The engine: task state and every change to it, with nothing of sockets.

``engine.Engine`` holds the request verbs; the modules beside it are what
it is made of:

- ``table``: the task table, every container a task can be in (wheel, ready
  queues and dead lists, delivery attempts, index, counts, packed windows)
  and every move between them;
- ``task``: the task, its states and the transition table; ``record``: its
  store record (the codec);
- ``validate``: request checks; ``index``: tasks by id and their counts;
  ``queues``: the ready queues, dead lists and blocked reserves;
- ``cold``: tasks held packed until their window, and loading at start-up;
- ``firing``: what time does (advance, the next fire, lateness);
- ``attempts``: delivery attempts of targeted tasks, ``retry`` their schedule;
- ``journal``: changes made durable in group commits;
- ``snapshot``: the figures ``stats`` and ``/metrics`` show.

This module imports none of them, so a caller that needs one (the CLI's
settings need ``validate`` and ``retry``) does not load the rest.
"""
