"""Each client's own copy of the methods of commands.py, for its flavour.

A plain copy for the blocking clients (named after the class, so a wrong argument is
reported as ``Client.add()``'s); one whose return annotation is ``None`` for the pipelines;
and for the asyncio clients an ``async def`` with the definition's signature that awaits
what the definition returns. That one is generated from the signature (as dataclasses
generates ``__init__``) because a wrapper taking ``*args`` would bind its arguments only
when awaited, and ``inspect`` would not see a coroutine function before Python 3.12. Its
source is put in ``linecache``, so ``inspect.getsource`` and tracebacks show it. A copy
costs nothing per call; the asyncio method one short frame more than a hand-written one.
"""

from __future__ import annotations

import inspect
import linecache
import types
from typing import Any, TypeVar

from delaywheel_client.commands import DEFINITIONS, Awaiting, Queuing

_C = TypeVar("_C", bound=type)


def serve(cls: _C) -> _C:
    """Give ``cls`` its own copy of every method, for its flavour (module docstring)."""
    for name, definition in DEFINITIONS.items():
        qualname = f"{cls.__qualname__}.{name}"
        if issubclass(cls, Awaiting):
            method = _awaiting(definition, qualname)
        else:
            method = _copy(definition)
            if issubclass(cls, Queuing):  # the result comes from execute()
                method.__annotations__ = {**definition.__annotations__, "return": "None"}
        method.__qualname__ = qualname
        method.__module__ = cls.__module__
        setattr(cls, name, method)
    return cls


def _copy(fn: Any) -> types.FunctionType:
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__doc__ = fn.__doc__
    copy.__annotations__ = dict(fn.__annotations__)
    return copy


def _awaiting(fn: Any, qualname: str) -> Any:
    """``async def`` with ``fn``'s signature, defaults, docstring and annotations, returning
    ``await fn(...)``."""
    params, forward = [], []
    star = False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            params.append(f"*{p.name}")
            forward.append(f"*{p.name}")
            star = True
        elif p.kind is p.VAR_KEYWORD:
            params.append(f"**{p.name}")
            forward.append(f"**{p.name}")
        elif p.kind is p.KEYWORD_ONLY:
            if not star:
                params.append("*")
                star = True
            params.append(p.name)
            forward.append(f"{p.name}={p.name}")
        else:
            params.append(p.name)
            forward.append(p.name)
    source = (
        f"async def {fn.__name__}({', '.join(params)}):\n"
        f"    return await _definition({', '.join(forward)})\n"
    )
    filename = f"<delaywheel_client.commands: {qualname}>"
    namespace: dict[str, Any] = {"_definition": fn}
    exec(compile(source, filename, "exec"), namespace)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    method = namespace[fn.__name__]
    method.__defaults__ = fn.__defaults__
    method.__kwdefaults__ = fn.__kwdefaults__
    method.__doc__ = fn.__doc__
    method.__annotations__ = dict(fn.__annotations__)
    return method
