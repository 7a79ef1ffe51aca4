"""Sans-IO MessagePack-RPC codec shared by the delaywheel server and its clients.

Theory of operation
-------------------
Bytes in, messages out; messages in, bytes out. Nothing here touches a socket, an event loop
or a clock: the caller reads bytes, hands them to ``Decoder.feed()``, iterates the decoder for
the messages that are now complete, and writes whatever ``Encoder`` returns.

Framing. MessagePack-RPC has no length prefix: each message is one MessagePack array and the
stream is those arrays back to back, so the only way to find where a message ends is to parse
it. One ``msgpack.Unpacker`` is fed incrementally; its C parser keeps its place inside a
half-received message across feeds, so a message that arrives in a thousand pieces is still
parsed once. The size of each message is the distance ``Unpacker.tell()`` moved while parsing
it. A decoded array is then checked against the three shapes ``[0, msgid, method, params]``,
``[1, msgid, error, result]`` and ``[2, method, params]``.

Memory. A decoder never keeps what an unfinished message claims: msgpack's C parser
preallocates every list and dict from its header's count, so a parser fed an unfinished
message holds what the message claims, not what was sent (1,000 nested headers claiming
100,000 entries each, 5 KB on the wire, held about 66 MB). Two ways through a chunk:

- The fast way, the common case: a chunk that arrives while nothing is buffered goes to one
  *fast* unpacker, whose arrays and maps may have at most ``FAST_CONTAINER_LEN`` entries
  (so its claims cost at most about 2 MB in all, 1,024 levels deep), and whole messages come
  out of it, each parsed once. When it stops short (the chunk ends mid-message, a container
  is bigger, the bytes are malformed) it is freed with whatever it started, and the rest of
  the chunk takes the safe way.
- The safe way: the same bytes go to two unpackers, a *skipper*, which walks the next
  message with ``skip()`` and builds nothing (its place inside a half-received message is a
  stack of counts), and the unpacker proper, whose ``unpack()`` is called only once the
  skipper has passed the whole message, when every claim has been paid for in bytes that
  arrived. A connection mid-message therefore holds its bytes twice and two parsers,
  whatever the bytes claim. Its errors are the decoder's errors (the fast way only gives up).

The safe way costs a second parse and a second copy of each chunk: about 2,000 more
instructions for a ``ping`` (callgrind, 2026-12-06), which is why it is not the only way.

An ``Unpacker`` is about 41 KiB however it is configured (its parser embeds a stack of 1024
levels), so a decoder holds one only while it has bytes buffered: from the ``feed()`` that
brings bytes until an iteration has yielded every one of them as a message. Then the
unpacker (or pair), empty and back at the start of a message, goes to a small pool shared by
every decoder of the process with the same limits, and the next decoder that receives bytes
takes it. Whole messages pass through one pooled fast unpacker; a connection mid-message
keeps its own pair, with the skipper's place, until the message is complete. An idle decoder
(a server's idle connection, a client's idle pooled connection) is a few attributes. The pool
is plain deques, so decoders in different threads may share it; one decoder is still not
thread-safe.

Limits. Input is untrusted, so every buffer is bounded:

- ``max_message_bytes`` caps one message. It is checked when a message has been passed
  (by the ``tell()`` delta; on the safe way before anything is built), and, so that nobody
  has to wait for 1 GB to arrive before refusing it, after every feed for the incomplete
  message still buffered. ``feed()`` also refuses input while more than the limit is
  already waiting, so the buffer stays below the limit plus one fed chunk even for a caller
  that feeds without iterating.
- ``max_container_len`` caps every array and map, checked as the safe way's unpacker builds
  it (the skipper does not check counts: it allocates nothing, and a claim it waits on is
  bounded by the message limit).
- ``max_message_bytes`` may be lowered after the decoder is made (a server does until a
  connection signs in) and put back, never above its first value.
- str, bin and ext payloads are capped at ``max_message_bytes`` (a bigger one cannot fit in a
  message anyway; without this msgpack would derive its caps from its 4 GiB buffer cap).

Errors. Input that is not a MessagePack-RPC message raises ``ProtocolError`` (the peer's
fault), with a docs/protocol.md code: ``too_large`` for a size limit, ``bad_request`` otherwise.
There is no frame boundary to resynchronise on, so after a ``ProtocolError`` the decoder is
dead: every later ``feed()`` or iteration raises the same error, and the caller is expected to
send ``[2, "error", [code, message]]`` and close the connection. Values we cannot pack are the
caller's fault and raise ``TypeError`` from ``Encoder``.

Where it is weak.

- The limits bound wire bytes, not Python objects. Decoded objects are larger than their
  encoding (an empty array is 1 byte on the wire and a 56-byte list in memory), so a message
  being handled costs up to about 60 times its size for as long as it is handled; nothing of
  it stays once it has been.
- A message that takes the safe way is parsed twice, once by the skipper and once by the
  unpacker; one that stops the fast way short is partly parsed a third time.
- A chunk is buffered whole before its messages are looked at, so callers must keep their
  read chunks small (64-256 KiB).
- ``receive()`` is all or nothing per chunk: when a chunk holds good messages followed by junk,
  it raises and the good messages are lost. Iterate instead to get them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, TypeAlias

import msgpack  # type: ignore[import-untyped, unused-ignore]

REQUEST = 0
RESPONSE = 1
NOTIFICATION = 2

# docs/protocol.md's --max-message default. A task body is at most 1 MiB packed, so 4 MiB
# leaves room for an add_many of a few full-size tasks, while a hundred connections each stuck
# mid-message hold at most 400 MiB of buffered bytes.
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024

# docs/protocol.md's per-container cap. No legitimate message comes near it (add_many batches
# and list pages are about a thousand tasks, a task map has a dozen fields), and it bounds what
# msgpack preallocates from a 5-byte array header before a single element has arrived.
MAX_CONTAINER_LEN = 100_000

MAX_MSGID = 2**32 - 1  # msgid is a uint32 in MessagePack-RPC

# Entries an array or map may have on the decoder's fast way (see "Memory"): a request's
# params and a task's map are a dozen; anything bigger takes the safe way. What the fast
# way's claims can preallocate is bounded by it: 1,024 levels of 64 entries, about 2 MB, and
# only while one chunk is parsed.
FAST_CONTAINER_LEN = 64

# Idle unpackers kept per set of limits for the next decoder that receives bytes (see
# "Memory"). A server holds about one at a time; more only while several of its connections
# are mid-message at once, and each is about 41 KiB of parser plus its buffer.
MAX_IDLE_UNPACKERS = 4
# An unpacker's first buffer: one read of the server (256 KiB at most) fits. One that had to
# grow (a message of megabytes) is freed afterwards, not pooled: the buffer never shrinks.
UNPACKER_BUFFER_BYTES = 256 * 1024


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid MessagePack-RPC message (the peer's fault)."""

    code: str  # an error code from docs/protocol.md: "bad_request" or "too_large"
    message: str  # human readable, names the offending value (type code, length, size...)

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class Request(NamedTuple):
    msgid: int
    method: str
    params: list[Any]


class Response(NamedTuple):
    msgid: int
    error: Any  # nil on success; as decoded, for the client to interpret
    result: Any


class Notification(NamedTuple):
    method: str
    params: list[Any]


Message: TypeAlias = Request | Response | Notification


class Decoder:
    """Turns a byte stream into messages: ``feed()`` bytes, then iterate.

    Iterate after every ``feed()``: iteration yields each message completed so far and stops,
    without an exception, when the rest needs more bytes. Malformed input raises
    ``ProtocolError``, after which the decoder is unusable (see the module docstring).

    A decoder holds an ``Unpacker`` only while it has bytes buffered (see "Memory" in the
    module docstring): an idle one is a few attributes.
    """

    __slots__ = (
        "_chunk",
        "_chunk_at",
        "_consumed",
        "_error",
        "_fed",
        "_grown",
        "_max_container_len",
        "_max_message_bytes",
        "_max_string_bytes",
        "_pool",
        "_shift",
        "_skipper",
        "unpacker",
    )

    def __init__(
        self,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_container_len: int = MAX_CONTAINER_LEN,
    ) -> None:
        if max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {max_message_bytes}")
        if max_container_len < 0:
            raise ValueError(f"max_container_len must be >= 0, got {max_container_len}")
        self._max_message_bytes = max_message_bytes
        # Built into the unpackers (their str, bin and ext cap): the largest limit
        # ``max_message_bytes`` may be set to later.
        self._max_string_bytes = max_message_bytes
        self._max_container_len = max_container_len
        self._pool = _pool_for(max_message_bytes, max_container_len)
        # The Unpacker held while bytes are buffered; None when none are (or when dead), so
        # a caller can tell an idle decoder at the cost of an attribute. Read it, never use it.
        # On the fast way (see "Memory") it is a fast unpacker and ``_chunk`` is the one
        # chunk it was fed; on the safe way it is held with its skipper, fed the same bytes.
        self.unpacker: Any = None
        self._skipper: Any = None
        self._chunk: bytes | None = None
        self._chunk_at = 0  # the stream offset of ``_chunk``'s first byte
        self._fed = 0  # bytes fed since the start of the stream
        self._consumed = 0  # stream offset just past the last message yielded
        # The held unpacker's ``tell()`` minus our stream offset: a pooled unpacker has
        # counted the bytes of every decoder that held it.
        self._shift = 0
        # The held unpacker's buffer may have grown past its first size: once empty it is
        # freed, not pooled (a buffer never shrinks).
        self._grown = False
        self._error: ProtocolError | None = None

    @property
    def max_message_bytes(self) -> int:
        """The message limit now. A server lowers it until a connection has signed in
        (``auth`` needs a few hundred bytes), then puts it back; it may not go above the
        limit the decoder was made with, which its unpackers' str and bin caps are."""
        return self._max_message_bytes

    @max_message_bytes.setter
    def max_message_bytes(self, limit: int) -> None:
        if not 1 <= limit <= self._max_string_bytes:
            raise ValueError(
                f"max_message_bytes must be in 1..{self._max_string_bytes}, got {limit}"
            )
        self._max_message_bytes = limit

    @property
    def buffered_bytes(self) -> int:
        """Bytes fed but not yet yielded as a message (after iterating: the incomplete one)."""
        return self._fed - self._consumed

    def feed(self, data: bytes) -> None:
        """Buffer ``data``. Raises ``ProtocolError("too_large")`` when more than
        ``max_message_bytes`` are already waiting (see the module docstring)."""
        if self._error is not None:
            raise self._error
        waiting = self._fed - self._consumed
        if waiting > self._max_message_bytes:
            raise self._fail(
                "too_large",
                f"{waiting} bytes are waiting to be decoded, over the "
                f"{self._max_message_bytes}-byte message limit",
            )
        size = len(data)
        if not size:
            return
        if self.unpacker is None:  # nothing buffered: the fast way (inline: once a read)
            try:
                fast = self._pool.fast.pop()
            except IndexError:  # none idle (in threads, another may just have taken it)
                fast = _new_unpacker(
                    self._max_string_bytes, min(FAST_CONTAINER_LEN, self._max_container_len)
                )
            self._shift = fast.tell() - self._consumed
            self._grown = size > UNPACKER_BUFFER_BYTES
            fast.feed(data)  # no BufferFull: its buffer may grow to 4 GiB
            self.unpacker, self._chunk, self._chunk_at = fast, data, self._fed
            self._fed += size
            return
        if self._skipper is None:  # more bytes before the fast chunk was all read
            self._go_safe()
        if waiting + size > UNPACKER_BUFFER_BYTES:
            self._grown = True
        try:
            self._skipper.feed(data)
            self.unpacker.feed(data)
        except msgpack.BufferFull:
            raise self._fail(
                "too_large", f"a {size}-byte chunk does not fit in the decoder"
            ) from None
        self._fed += size

    def _go_safe(self) -> None:
        """Leave the fast way: the bytes of the fast chunk not yet yielded go to a
        (skipper, unpacker) pair, and the fast unpacker, which may hold the start of
        an unfinished message, is freed (see "Memory")."""
        chunk = self._chunk
        assert chunk is not None
        rest = memoryview(chunk)[self._consumed - self._chunk_at :]
        self._chunk = None
        try:
            skipper, unpacker = self._pool.safe.pop()
        except IndexError:
            skipper = _new_unpacker(self._max_string_bytes, self._max_container_len)
            unpacker = _new_unpacker(self._max_string_bytes, self._max_container_len)
        self._shift = skipper.tell() - self._consumed
        self.unpacker, self._skipper = unpacker, skipper
        self._grown = len(rest) > UNPACKER_BUFFER_BYTES
        skipper.feed(rest)
        unpacker.feed(rest)

    def __iter__(self) -> Iterator[Message]:
        """Yield the messages completed so far; stop when more data is needed."""
        if self._error is not None:
            raise self._error
        # unpack() while bytes are left, not ``for obj in unpacker``: that ends every
        # read with a StopIteration, whose Cython traceback costs more than decoding a
        # small message (docs/performance.md). Only a read that ends mid-message raises,
        # OutOfData.
        # What is held, read again wherever it may have changed: after _go_safe, and
        # after each yield (the caller may have fed more meanwhile).
        unpacker, skipper, shift = self.unpacker, self._skipper, self._shift
        while self._consumed < self._fed:
            if skipper is None:  # the fast way: the unpacker alone, small containers
                try:
                    obj = unpacker.unpack()
                except Exception:  # cut short, or beyond the fast way: the safe way
                    self._go_safe()
                    unpacker, skipper, shift = self.unpacker, self._skipper, self._shift
                    continue
                end = unpacker.tell() - shift
            else:  # the safe way: skip() first, so that unpack() parses whole messages
                try:
                    try:
                        skipper.skip()
                    except msgpack.OutOfData:
                        break
                    end = skipper.tell() - shift
                    if end - self._consumed <= self._max_message_bytes:
                        obj = unpacker.unpack()
                except (ValueError, TypeError, RecursionError) as exc:
                    raise self._fail(*_unpack_error(exc, skipper, shift)) from exc
            size = end - self._consumed
            if size > self._max_message_bytes:
                limit = self._max_message_bytes
                raise self._fail(
                    "too_large", f"a {size}-byte message is over the {limit}-byte limit"
                )
            self._consumed = end
            # Fast path for a well-formed request or response, inline because this runs
            # once per message; everything else, errors included, goes the long way.
            if type(obj) is list and len(obj) == 4:
                kind, msgid, third, fourth = obj
                if type(kind) is int and type(msgid) is int and 0 <= msgid <= MAX_MSGID:
                    if kind == REQUEST and type(third) is str and type(fourth) is list:
                        obj = _new(Request, (msgid, third, fourth))
                    elif kind == RESPONSE:
                        obj = _new(Response, (msgid, third, fourth))
                    else:
                        obj = self._checked(obj)
                else:
                    obj = self._checked(obj)
            else:
                obj = self._checked(obj)
            if end != self._fed:
                yield obj
                unpacker, skipper, shift = self.unpacker, self._skipper, self._shift
                continue
            # The last whole message of what was fed: the unpackers are empty and at the
            # start of a message, so they go back now, before the yield, since a caller
            # may stop at this message and never resume (inline: once a read).
            self.unpacker = self._skipper = self._chunk = None
            if self._grown:
                self._grown = False
            elif skipper is None:
                self._pool.fast.append(unpacker)
            else:
                self._pool.safe.append((skipper, unpacker))
            yield obj
            unpacker, skipper, shift = self.unpacker, self._skipper, self._shift
        waiting = self._fed - self._consumed
        if waiting > self._max_message_bytes:
            limit = self._max_message_bytes
            raise self._fail(
                "too_large",
                f"an incomplete message is already {waiting} bytes, over the {limit}-byte limit",
            )

    def _checked(self, obj: Any) -> Message:
        try:
            return _to_message(obj)
        except ProtocolError as exc:
            self._error = exc
            self.unpacker = self._skipper = self._chunk = None
            raise

    def receive(self, data: bytes) -> list[Message]:
        """``feed(data)`` and return the messages now complete. All or nothing: if ``data``
        also holds junk, this raises and the good messages before it are lost."""
        self.feed(data)
        return list(self)

    def _fail(self, code: str, message: str) -> ProtocolError:
        self._error = ProtocolError(code, message)
        # mid-parse or broken: never back to the pool
        self.unpacker = self._skipper = self._chunk = None
        return self._error


class _Pool:
    """The idle unpackers of one set of limits: fast ones (``FAST_CONTAINER_LEN``) and
    (skipper, unpacker) pairs, each a deque whose ``maxlen`` frees the oldest when one
    more is given back to a full one."""

    __slots__ = ("fast", "safe")

    def __init__(self) -> None:
        self.fast: deque[Any] = deque(maxlen=MAX_IDLE_UNPACKERS)
        self.safe: deque[tuple[Any, Any]] = deque(maxlen=MAX_IDLE_UNPACKERS)


# The idle unpackers, by the limits they were made with: ``(max_message_bytes,
# max_container_len) -> _Pool``. Limits are built into an Unpacker, so decoders share only
# with decoders of the same limits; a process has a few sets of them (the server's, the
# client's), and a decoder with limits beyond MAX_POOLS sets keeps a pool of its own.
_pools: dict[tuple[int, int], _Pool] = {}
MAX_POOLS = 8


def _pool_for(max_message_bytes: int, max_container_len: int) -> _Pool:
    """The pool of idle unpackers for these limits."""
    key = (max_message_bytes, max_container_len)
    pool = _pools.get(key)
    if pool is None:
        pool = _Pool()
        if len(_pools) < MAX_POOLS:
            pool = _pools.setdefault(key, pool)
    return pool


def _new_unpacker(max_message_bytes: int, max_container_len: int) -> Any:
    return msgpack.Unpacker(
        raw=False,  # str -> str, bin -> bytes
        strict_map_key=False,  # task bodies may have int keys
        use_list=True,
        read_size=UNPACKER_BUFFER_BYTES,
        max_buffer_size=0,  # 4 GiB; our own checks bound the buffer far below that
        max_array_len=max_container_len,
        max_map_len=max_container_len,
        max_str_len=max_message_bytes,
        max_bin_len=max_message_bytes,
        max_ext_len=max_message_bytes,
    )


class Encoder:
    """Reusable packer (one per connection); every method returns bytes.

    Packs with ``use_bin_type=True``: bytes go out as bin, str as str. A value MessagePack
    cannot carry (an unsupported type, an int beyond 64 bits) raises ``TypeError``: that is the
    caller's bug, not the peer's. A ``msgid`` outside 0..2**32-1 raises ``ValueError``.
    """

    __slots__ = ("_pack",)

    def __init__(self) -> None:
        # Packer resets its buffer when pack() raises, so a failed pack leaves it usable.
        self._pack = msgpack.Packer(use_bin_type=True).pack

    def request(self, msgid: int, method: str, params: Sequence[Any]) -> bytes:
        if not 0 <= msgid <= MAX_MSGID:
            raise _bad_msgid(msgid)
        if type(params) is not list and type(params) is not tuple:
            params = _as_array(params)
        try:
            return self._pack([REQUEST, msgid, method, params])  # type: ignore[no-any-return]
        except (OverflowError, ValueError) as exc:
            raise TypeError(f"cannot pack request {method!r}: {exc}") from exc

    def response(self, msgid: int, result: Any) -> bytes:
        if not 0 <= msgid <= MAX_MSGID:
            raise _bad_msgid(msgid)
        try:
            return self._pack([RESPONSE, msgid, None, result])  # type: ignore[no-any-return]
        except (OverflowError, ValueError) as exc:
            raise TypeError(f"cannot pack response to {msgid}: {exc}") from exc

    def error_response(
        self, msgid: int, code: str, message: str, data: dict[str, Any] | None = None
    ) -> bytes:
        """``[code, message]``, or ``[code, message, data]`` when there is data."""
        if not 0 <= msgid <= MAX_MSGID:
            raise _bad_msgid(msgid)
        error = [code, message] if data is None else [code, message, data]
        return self._pack([RESPONSE, msgid, error, None])  # type: ignore[no-any-return]

    def notification(self, method: str, params: Sequence[Any]) -> bytes:
        if type(params) is not list and type(params) is not tuple:
            params = _as_array(params)
        try:
            return self._pack([NOTIFICATION, method, params])  # type: ignore[no-any-return]
        except (OverflowError, ValueError) as exc:
            raise TypeError(f"cannot pack notification {method!r}: {exc}") from exc


# NamedTuple's generated __new__ is a Python function; tuple.__new__ builds the same object at
# half the cost, which is worth having once per message.
_new = tuple.__new__


def _to_message(obj: Any) -> Message:
    """Check a decoded object's shape; the common cases cost a few ``type()`` checks."""
    if type(obj) is list:
        n = len(obj)
        if n == 4:
            kind, msgid, third, fourth = obj
            if type(kind) is int and kind in (REQUEST, RESPONSE):
                if type(msgid) is not int or not 0 <= msgid <= MAX_MSGID:
                    raise _bad_msgid_in(msgid)
                if kind == RESPONSE:
                    return _new(Response, (msgid, third, fourth))
                if type(third) is not str:
                    third = _method_name(third)
                if type(fourth) is not list:
                    raise _bad_params(fourth)
                return _new(Request, (msgid, third, fourth))
        elif n == 3:
            kind, method, params = obj
            if type(kind) is int and kind == NOTIFICATION:
                if type(method) is not str:
                    method = _method_name(method)
                if type(params) is not list:
                    raise _bad_params(params)
                return _new(Notification, (method, params))
    raise _bad_shape(obj)


def _bad_shape(obj: Any) -> ProtocolError:
    if type(obj) is not list:
        return ProtocolError("bad_request", f"a message must be an array, got {_describe(obj)}")
    if not obj:
        return ProtocolError("bad_request", "a message must be an array, got an empty one")
    kind = obj[0]
    if type(kind) is not int:
        return ProtocolError("bad_request", f"message type must be an int, got {_describe(kind)}")
    if kind not in (REQUEST, RESPONSE, NOTIFICATION):
        return ProtocolError(
            "bad_request",
            f"unknown message type {kind} (0 request, 1 response, 2 notification)",
        )
    name, expected = {REQUEST: ("request", 4), RESPONSE: ("response", 4)}.get(
        kind, ("notification", 3)
    )
    return ProtocolError("bad_request", f"a {name} must have {expected} elements, got {len(obj)}")


def _method_name(method: Any) -> str:
    if type(method) is bytes:
        try:
            return method.decode()
        except UnicodeDecodeError:
            raise ProtocolError(
                "bad_request", f"method is not valid UTF-8: {_describe(method)}"
            ) from None
    raise ProtocolError("bad_request", f"method must be a str or bin, got {_describe(method)}")


def _bad_msgid_in(msgid: Any) -> ProtocolError:
    return ProtocolError("bad_request", f"msgid must be a uint32, got {_describe(msgid)}")


def _bad_params(params: Any) -> ProtocolError:
    return ProtocolError("bad_request", f"params must be an array, got {_describe(params)}")


def _unpack_error(exc: Exception, unpacker: msgpack.Unpacker, shift: int) -> tuple[str, str]:
    """Name what msgpack refused; (code, message) for ProtocolError. ``shift``: the
    unpacker's stream offset minus the decoder's (see ``Decoder``)."""
    if isinstance(exc, msgpack.FormatError):
        # The C parser stops on the bad byte, so it is the next one in the buffer.
        offset = unpacker.tell() - shift
        try:
            byte = unpacker.read_bytes(1)
        except ValueError:
            byte = b""
        shown = f"byte 0x{byte[0]:02x}" if byte else "byte"
        return "bad_request", f"undecodable MessagePack {shown} at stream offset {offset}"
    if isinstance(exc, (msgpack.StackError, RecursionError)):
        return "bad_request", "arrays and maps nested deeper than MessagePack's 1024-level limit"
    if isinstance(exc, UnicodeDecodeError):
        return "bad_request", f"a str is not valid UTF-8: {exc}"
    if isinstance(exc, TypeError):  # an array or map used as a map key
        return "bad_request", f"map key cannot be used: {exc}"
    text = str(exc)
    if "exceeds max_" in text:  # msgpack's wording: "131072 exceeds max_array_len(100000)"
        return "too_large", f"over a size limit: {text}"
    return "bad_request", f"undecodable MessagePack: {text}"


_TYPE_NAMES = {
    type(None): "nil",
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    bytes: "bin",
    list: "array",
    dict: "map",
    msgpack.ExtType: "ext",
    msgpack.Timestamp: "timestamp",
}


def _describe(value: Any) -> str:
    """The msgpack type and a short, bounded rendering of a value for an error message."""
    name = _TYPE_NAMES.get(type(value), type(value).__name__)
    if isinstance(value, (list, dict)):
        return f"{name} of length {len(value)}"
    if isinstance(value, (str, bytes)):
        more = "..." if len(value) > 40 else ""
        return f"{name} {value[:40]!r}{more}"
    if isinstance(value, msgpack.ExtType):
        return f"ext type {value.code} of {len(value.data)} bytes"
    return f"{name} {value!r}"


def _bad_msgid(msgid: int) -> ValueError:
    return ValueError(f"msgid must be in 0..{MAX_MSGID}, got {msgid!r}")


def _as_array(params: Sequence[Any]) -> list[Any]:
    if isinstance(params, (str, bytes, bytearray)):
        raise TypeError(f"params must be an array, got {type(params).__name__}")
    return list(params)
