"""The MessagePack-RPC codec: real bytes in and out, every input fed three ways.

Three ways, as h11 does it: the whole input in one feed, one byte per feed, and followed by
junk (the good messages before the junk must still come out, then ProtocolError).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pytest
from delaywheel_client.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_CONTAINER_LEN,
    MAX_MSGID,
    NOTIFICATION,
    REQUEST,
    RESPONSE,
    Decoder,
    Encoder,
    Message,
    Notification,
    ProtocolError,
    Request,
    Response,
)
from hypothesis import given, settings
from hypothesis import strategies as st

ExtType = msgpack.ExtType
Timestamp = msgpack.Timestamp

# An undecodable byte, and a well-formed object that is not a message.
JUNK = [b"\xc1", msgpack.packb(5)]


def packb(obj: Any) -> bytes:
    """Raw wire bytes as any third-party client would make them."""
    result: bytes = msgpack.packb(obj, use_bin_type=True)
    return result


def collect(
    decoder: Decoder, chunks: Iterable[bytes]
) -> tuple[list[Message], ProtocolError | None]:
    """Feed chunks, iterating after each, as the server's read loop does."""
    out: list[Message] = []
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            for message in decoder:
                out.append(message)
    except ProtocolError as exc:
        return out, exc
    return out, None


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def typed(value: Any) -> Any:
    """A comparable form that tells bool from int, bin from str, -0.0 from 0.0, and message
    kinds apart (NamedTuples alone compare as plain tuples)."""
    if isinstance(value, (Request, Response, Notification)):
        return (type(value).__name__, [typed(v) for v in value])
    if isinstance(value, (list, tuple)):
        return ("array", [typed(v) for v in value])
    if isinstance(value, dict):
        return ("map", [(typed(k), typed(v)) for k, v in value.items()])
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def decode_three_ways(data: bytes, **limits: int) -> list[Message]:
    whole, error = collect(Decoder(**limits), [data])
    assert error is None
    one_by_one, error = collect(Decoder(**limits), bytewise(data))
    assert error is None
    assert typed(one_by_one) == typed(whole)
    for junk in JUNK:
        for chunks in ([data + junk], bytewise(data + junk)):
            before_junk, error = collect(Decoder(**limits), chunks)
            assert typed(before_junk) == typed(whole)
            assert error is not None
            assert error.code == "bad_request"
    return whole


def reject_three_ways(data: bytes, code: str, fragment: str, **limits: int) -> None:
    for chunks in ([data], bytewise(data), [data + JUNK[0]], [data + JUNK[1]]):
        decoder = Decoder(**limits)
        got, error = collect(decoder, chunks)
        assert got == []
        assert error is not None, chunks
        assert error.code == code
        assert fragment in error.message, error.message


# -- each message kind ---------------------------------------------------------

enc = Encoder()

ROUND_TRIPS = [
    (enc.request(7, "ping", []), Request(7, "ping", [])),
    (
        enc.request(MAX_MSGID, "add", [{"topic": "t", "delay": 1.5}]),
        Request(MAX_MSGID, "add", [{"topic": "t", "delay": 1.5}]),
    ),
    (enc.request(0, "reserve", (["a", "b"], 0)), Request(0, "reserve", [["a", "b"], 0])),
    (enc.response(7, "pong"), Response(7, None, "pong")),
    (enc.response(8, None), Response(8, None, None)),
    (
        enc.error_response(9, "not_found", "no task 'x'"),
        Response(9, ["not_found", "no task 'x'"], None),
    ),
    (enc.notification("error", ["too_large", "big"]), Notification("error", ["too_large", "big"])),
    (enc.notification("nvim_hello", ()), Notification("nvim_hello", [])),
    # A response's error is passed through whatever it is; clients interpret it.
    (packb([1, 3, {"odd": "error"}, 5]), Response(3, {"odd": "error"}, 5)),
    # Some clients send the method name as bin.
    (packb([0, 1, b"ping", []]), Request(1, "ping", [])),
    (packb([2, "h\xe9".encode(), [1]]), Notification("h\xe9", [1])),
    (packb([0, 2, "", []]), Request(2, "", [])),
]


@pytest.mark.parametrize(("data", "expected"), ROUND_TRIPS)
def test_round_trip(data: bytes, expected: Message) -> None:
    (message,) = decode_three_ways(data)
    assert typed(message) == typed(expected)


def test_encoder_matches_plain_msgpack() -> None:
    assert enc.request(1, "get", ["id"]) == packb([REQUEST, 1, "get", ["id"]])
    assert enc.response(1, b"\x00") == packb([RESPONSE, 1, None, b"\x00"])
    assert enc.error_response(2, "conflict", "m") == packb([RESPONSE, 2, ["conflict", "m"], None])
    assert enc.notification("error", ["c", "m"]) == packb([NOTIFICATION, "error", ["c", "m"]])


def test_pipelined_messages_in_one_feed() -> None:
    sent: list[Message] = []
    data = bytearray()
    for i in range(1000):
        if i % 3 == 0:
            sent.append(Request(i, "get", [f"task-{i}"]))
            data += enc.request(i, "get", [f"task-{i}"])
        elif i % 3 == 1:
            sent.append(Response(i, None, {"id": i}))
            data += enc.response(i, {"id": i})
        else:
            sent.append(Notification("n", [i]))
            data += enc.notification("n", [i])
    decoder = Decoder()
    assert typed(decoder.receive(bytes(data))) == typed(sent)
    assert decoder.buffered_bytes == 0


def test_buffered_bytes_counts_the_incomplete_message() -> None:
    first = enc.request(1, "ping", [])
    second = enc.request(2, "get", ["some-task-id"])
    decoder = Decoder()
    assert decoder.receive(first + second[:5]) == [Request(1, "ping", [])]
    assert decoder.buffered_bytes == 5
    assert decoder.receive(second[5:]) == [Request(2, "get", ["some-task-id"])]
    assert decoder.buffered_bytes == 0
    assert decoder.receive(b"") == []


# -- bodies of every msgpack type ------------------------------------------------

BODIES = [
    None,
    True,
    False,
    0,
    -1,
    2**64 - 1,
    -(2**63),
    1.5,
    -0.0,
    "",
    "h\xe9llo \u2603",
    b"",
    b"\x00\xff bin stays bin",
    [],
    [1, [2, [3]], "x"],
    {},
    {1: "int key", "k": b"v", -3: None, 2.5: [True]},
    ExtType(5, b"xy"),
    ExtType(127, b""),
    Timestamp(1, 2),  # 64-bit form
    Timestamp(2**34, 999_999_999),  # 96-bit form
    Timestamp(-1, 0),  # 96-bit form, before the epoch
    {"body": [ExtType(1, b"\x01"), Timestamp(0, 0), {0: b""}]},
]


@pytest.mark.parametrize("body", BODIES, ids=repr)
def test_body_round_trips_with_its_type(body: Any) -> None:
    data = (
        enc.request(1, "add", [{"topic": "t", "body": body}])
        + enc.response(2, body)
        + enc.notification("n", [body])
    )
    request, response, notification = decode_three_ways(data)
    assert isinstance(request, Request)
    assert isinstance(response, Response)
    assert isinstance(notification, Notification)
    for decoded in (request.params[0]["body"], response.result, notification.params[0]):
        assert type(decoded) is type(body)
        assert typed(decoded) == typed(body)
    # And back out unchanged: what we decode, we re-encode to the same bytes.
    assert enc.response(2, response.result) == enc.response(2, body)


# -- bad input ----------------------------------------------------------------------

MALFORMED = [
    # not an array: say which type arrived
    (packb(5), "int 5"),
    (packb({"a": 1}), "map of length 1"),
    (packb("hello"), "str 'hello'"),
    (packb(None), "nil"),
    (packb(b"\x01"), "bin b'\\x01'"),
    (packb(1.25), "float 1.25"),
    (packb([]), "empty"),
    # wrong length
    (packb([0, 1, "m"]), "request must have 4 elements, got 3"),
    (packb([0, 1, "m", [], 5]), "request must have 4 elements, got 5"),
    (packb([1, 1, None]), "response must have 4 elements, got 3"),
    (packb([2, "m", [], 1]), "notification must have 3 elements, got 4"),
    (packb([2]), "notification must have 3 elements, got 1"),
    # unknown or ill-typed type code
    (packb([3, 1, "m", []]), "unknown message type 3"),
    (packb([-1, "m", []]), "unknown message type -1"),
    (packb(["0", 1, "m", []]), "str '0'"),
    (packb([True, 1, "m", []]), "bool True"),
    (packb([0.0, 1, "m", []]), "float 0.0"),
    # msgid not a uint32
    (packb([0, "1", "m", []]), "str '1'"),
    (packb([0, 1.0, "m", []]), "float 1.0"),
    (packb([0, True, "m", []]), "bool True"),
    (packb([0, None, "m", []]), "nil"),
    (packb([0, -1, "m", []]), "int -1"),
    (packb([0, 2**32, "m", []]), "int 4294967296"),
    (packb([1, 2**32, None, None]), "int 4294967296"),
    (packb([1, "x", None, None]), "str 'x'"),
    # method not str or bin, or bin that is not UTF-8
    (packb([0, 1, 5, []]), "int 5"),
    (packb([2, None, []]), "nil"),
    (packb([0, 1, ["m"], []]), "array of length 1"),
    (packb([0, 1, b"\xff\xfe", []]), "b'\\xff\\xfe'"),
    (packb([2, b"\xc3", []]), "b'\\xc3'"),
    # params not an array
    (packb([0, 1, "m", {"a": 1}]), "map of length 1"),
    (packb([0, 1, "m", None]), "nil"),
    (packb([2, "m", "x"]), "str 'x'"),
    (packb([2, "m", 7]), "int 7"),
    # bytes that are not MessagePack at all
    (b"\xc1", "0xc1"),
    (packb([0, 1, "m", [1, 2]])[:-1] + b"\xc1", "0xc1"),
    (b"\x94\x00\x01\xa1m\x91\xa2\xff\xfe", "0xff"),  # a str that is not UTF-8
    (b"\x81\x91\x01\x01", "unhashable"),  # an array as a map key
    (b"\x94\x00\x01\xa1m\x91\x81\x80\x01", "unhashable"),  # a map as a map key
    (b"\xc7\x03\xff\x00\x00\x00", "timestamp"),  # a timestamp of 3 bytes
    (b"\x91" * 1100 + b"\x00", "nested"),  # deeper than msgpack's 1024 levels
]


@pytest.mark.parametrize(("data", "fragment"), MALFORMED)
def test_malformed_input_is_a_bad_request(data: bytes, fragment: str) -> None:
    reject_three_ways(data, "bad_request", fragment)


def test_reserved_ext_type_is_a_bad_request() -> None:
    # Ext types below -1 are reserved by the spec; msgpack refuses to build them.
    reject_three_ways(b"\xd4\xfb\x00", "bad_request", "undecodable")


def test_good_messages_before_bad_ones_still_come_out() -> None:
    good = enc.request(1, "ping", []) + enc.notification("hello", [])
    bad = packb([0, 2, "m", "not an array"])
    got, error = collect(Decoder(), [good + bad + enc.request(3, "never", [])])
    assert got == [Request(1, "ping", []), Notification("hello", [])]
    assert error is not None
    assert error.code == "bad_request"
    assert "str 'not an array'" in error.message


def test_decoder_is_dead_after_an_error() -> None:
    decoder = Decoder()
    with pytest.raises(ProtocolError) as first:
        decoder.receive(b"\xc1")
    with pytest.raises(ProtocolError) as again:
        decoder.feed(enc.request(1, "ping", []))
    assert again.value is first.value
    with pytest.raises(ProtocolError):
        list(decoder)


def test_receive_is_all_or_nothing_per_chunk() -> None:
    with pytest.raises(ProtocolError):
        Decoder().receive(enc.request(1, "ping", []) + b"\xc1")


def test_protocol_error_fields() -> None:
    error = ProtocolError("too_large", "a 9-byte message is over the 8-byte limit")
    assert error.code == "too_large"
    assert error.message == "a 9-byte message is over the 8-byte limit"
    assert str(error) == "too_large: a 9-byte message is over the 8-byte limit"
    assert isinstance(error, Exception)


# -- size limits ----------------------------------------------------------------------


def sized_request(size: int) -> bytes:
    """A request of exactly ``size`` bytes, none of its values near a str or container cap."""
    data = enc.request(1, "m", [])
    pad = size - len(data)
    assert 0 <= pad < 16, "make sizes with room for 16 one-byte ints"
    data = enc.request(1, "m", [0] * pad)
    assert len(data) == size
    return data


def test_message_at_the_limit_is_accepted() -> None:
    data = sized_request(20)
    assert decode_three_ways(data, max_message_bytes=20) == [Request(1, "m", [0] * 14)]


def test_oversized_complete_message_is_too_large() -> None:
    data = sized_request(21)
    got, error = collect(Decoder(max_message_bytes=20), [enc.request(0, "ok", []) + data])
    assert got == [Request(0, "ok", [])]
    assert error is not None
    assert error.code == "too_large"
    assert "a 21-byte message is over the 20-byte limit" in error.message


def test_oversized_message_is_refused_before_it_is_complete() -> None:
    # One byte at a time, the message is refused as soon as its first 21 bytes are in.
    data = enc.request(1, "m", [0] * 24)
    assert len(data) > 21
    decoder = Decoder(max_message_bytes=20)
    got, error = collect(decoder, bytewise(data[:21]))
    assert got == []
    assert error is not None
    assert error.code == "too_large"
    assert "an incomplete message is already 21 bytes" in error.message


def test_a_gigabyte_claim_is_refused_after_about_the_limit() -> None:
    # A bin header claiming 1 GiB, then zeros: the decoder gives up near the limit.
    chunk = bytes(64 * 1024)
    decoder = Decoder()
    decoder.feed(b"\x94\x00\x01\xa1m\x91\xc6" + (2**30).to_bytes(4, "big"))
    fed = 0
    with pytest.raises(ProtocolError) as info:
        while True:
            assert list(decoder) == []
            assert decoder.buffered_bytes <= DEFAULT_MAX_MESSAGE_BYTES + len(chunk) + 16
            decoder.feed(chunk)
            fed += len(chunk)
    assert info.value.code == "too_large"
    assert fed <= DEFAULT_MAX_MESSAGE_BYTES + len(chunk)


def test_feed_refuses_more_when_the_caller_does_not_drain() -> None:
    # The buffer stays within the limit plus one chunk even if nobody iterates.
    small = enc.request(1, "ping", [])
    decoder = Decoder(max_message_bytes=100)
    decoder.feed(small * 20)  # 180 bytes of complete messages, not iterated
    with pytest.raises(ProtocolError) as info:
        decoder.feed(small)
    assert info.value.code == "too_large"
    assert f"{len(small) * 20} bytes are waiting" in info.value.message


@pytest.mark.parametrize("container", ["array", "map"])
def test_container_over_the_limit_is_too_large(container: str) -> None:
    def body(n: int) -> Any:
        return list(range(n)) if container == "array" else {i: i for i in range(n)}

    assert decode_three_ways(enc.request(1, "m", [body(10)]), max_container_len=10)
    reject_three_ways(
        enc.request(1, "m", [body(11)]),
        "too_large",
        f"11 exceeds max_{container}_len(10)",
        max_container_len=10,
    )


def test_default_container_limit() -> None:
    at_limit = Decoder().receive(enc.request(1, "m", [[0] * MAX_CONTAINER_LEN]))
    assert len(at_limit) == 1
    with pytest.raises(ProtocolError) as info:
        Decoder().receive(enc.request(1, "m", [[0] * (MAX_CONTAINER_LEN + 1)]))
    assert info.value.code == "too_large"
    assert str(MAX_CONTAINER_LEN + 1) in info.value.message


def test_str_over_the_limit_is_too_large() -> None:
    # The message is measured before anything of it is built, so its size is what is named.
    data = enc.request(1, "m", ["x" * 60])
    reject_three_ways(data, "too_large", "", max_message_bytes=50)
    with pytest.raises(ProtocolError, match="a 68-byte message is over the 50-byte limit"):
        Decoder(max_message_bytes=50).receive(data)


def test_lowered_limit_applies_and_can_be_put_back() -> None:
    # A server lowers the limit until a connection signs in (net/connection.py).
    decoder = Decoder(max_message_bytes=1000)
    decoder.max_message_bytes = 50
    assert decoder.receive(enc.request(1, "auth", ["t" * 20]))[0].method == "auth"
    decoder.max_message_bytes = 1000
    assert decoder.receive(enc.request(2, "m", ["x" * 500]))[0].msgid == 2
    decoder.max_message_bytes = 50
    with pytest.raises(ProtocolError, match="over the 50-byte limit"):
        decoder.receive(enc.request(3, "m", ["x" * 60]))
    with pytest.raises(ValueError, match=r"1\.\.1000"):
        Decoder(max_message_bytes=1000).max_message_bytes = 1001


def test_unfinished_claims_build_nothing() -> None:
    # 1,000 nested headers each claiming 100,000 entries, never finished: the skipper walks
    # them without building, so nothing is preallocated (issue 30, finding 1). The decoder's
    # two parsers and their buffers are about 600 kB; one list of 100,000 is another 800 kB
    # (all 1,000 were 800 MB before).
    import tracemalloc

    bomb = b"\x94\x00\x01\xa3add" + b"\xdd\x00\x01\x86\xa0" * 1000
    decoder = Decoder()
    tracemalloc.start()
    try:
        for i in range(0, len(bomb), 7):
            decoder.feed(bomb[i : i + 7])
            assert list(decoder) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak
    assert decoder.buffered_bytes == len(bomb)


@pytest.mark.parametrize("limits", [{"max_message_bytes": 0}, {"max_container_len": -1}])
def test_decoder_rejects_nonsense_limits(limits: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        Decoder(**limits)


# -- the encoder's own errors --------------------------------------------------------------


@pytest.mark.parametrize("value", [object(), 2**64, -(2**63) - 1, {1, 2}])
def test_unpackable_value_is_a_type_error_and_the_encoder_survives(value: Any) -> None:
    with pytest.raises(TypeError):
        enc.response(1, [1, 2, value])
    with pytest.raises(TypeError):
        enc.request(1, "add", [value])
    with pytest.raises(TypeError):
        enc.notification("n", [value])
    # Nothing of the failed message is left in the packer.
    assert enc.response(1, "ok") == packb([1, 1, None, "ok"])


@pytest.mark.parametrize("msgid", [-1, 2**32])
def test_encoder_refuses_msgid_out_of_range(msgid: int) -> None:
    with pytest.raises(ValueError, match=str(msgid)):
        enc.request(msgid, "ping", [])
    with pytest.raises(ValueError):
        enc.response(msgid, None)
    with pytest.raises(ValueError):
        enc.error_response(msgid, "internal", "boom")


def test_encoder_params_are_any_sequence_but_not_a_string() -> None:
    assert enc.request(1, "m", range(3)) == packb([0, 1, "m", [0, 1, 2]])
    with pytest.raises(TypeError):
        enc.request(1, "m", "abc")
    with pytest.raises(TypeError):
        enc.notification("m", b"abc")


# -- property: any split of any valid stream decodes the same -------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.builds(ExtType, st.integers(0, 127), st.binary(max_size=10)),
    st.builds(Timestamp, st.integers(-(2**63), 2**63 - 1), st.integers(0, 999_999_999)),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=5), st.integers(-99, 99)), children, max_size=4),
    ),
    max_leaves=8,
)
msgids = st.integers(0, MAX_MSGID)
params = st.lists(values, max_size=3)
messages = st.one_of(
    st.builds(Request, msgids, st.text(max_size=10), params),
    st.builds(Response, msgids, values, values),
    st.builds(Notification, st.text(max_size=10), params),
)


def encode(message: Message) -> bytes:
    if isinstance(message, Request):
        return enc.request(*message)
    if isinstance(message, Notification):
        return enc.notification(*message)
    if message.error is None:
        return enc.response(message.msgid, message.result)
    return packb([RESPONSE, *message])


@settings(max_examples=100, deadline=None)
@given(st.lists(messages, max_size=6), st.data())
def test_any_split_of_valid_messages_decodes_the_same(
    sent: list[Message], data: st.DataObject
) -> None:
    stream = b"".join(encode(m) for m in sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    decoder = Decoder()
    got, error = collect(decoder, chunks)
    assert error is None
    assert typed(got) == typed(sent)
    assert decoder.buffered_bytes == 0
