"""The Decoder's shared unpackers (protocol.py, "Memory"): a decoder holds one only while
bytes are buffered, gives it back once every byte came out as a message, and decoders that
share them never see each other's bytes, errors or offsets.

tests/test_protocol.py checks what a decoder yields and refuses; these check what it holds.
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pytest
from delaywheel_client import protocol
from delaywheel_client.protocol import (
    MAX_IDLE_UNPACKERS,
    UNPACKER_BUFFER_BYTES,
    Decoder,
    Encoder,
    Message,
    ProtocolError,
    Request,
    Response,
)
from hypothesis import given, settings
from hypothesis import strategies as st

enc = Encoder()
PING = enc.request(1, "ping", [])


def pool_of(decoder: Decoder) -> Any:
    """The idle unpackers of the decoder's pool: fast ones, and the safe way's (each
    pooled with its skipper)."""
    pool = decoder._pool
    return [*pool.fast, *(unpacker for _skipper, unpacker in pool.safe)]


def decode(decoder: Decoder, data: bytes) -> list[Message]:
    decoder.feed(data)
    return list(decoder)


def test_an_idle_decoder_holds_no_unpacker() -> None:
    decoder = Decoder()
    assert decoder.unpacker is None
    assert decode(decoder, PING) == [Request(1, "ping", [])]
    assert decoder.unpacker is None
    decoder.feed(b"")
    assert decoder.unpacker is None
    assert list(decoder) == []


def test_whole_messages_pass_through_one_shared_unpacker() -> None:
    first, second = Decoder(), Decoder()
    first.feed(PING)
    held = first.unpacker
    assert held is not None
    assert list(first) == [Request(1, "ping", [])]
    assert held in pool_of(first)
    second.feed(enc.request(2, "get", ["a"]))
    assert second.unpacker is held  # the one the first gave back
    assert list(second) == [Request(2, "get", ["a"])]


def test_a_decoder_mid_message_keeps_its_unpacker() -> None:
    waiting, other = Decoder(), Decoder()
    message = enc.request(3, "add", [{"topic": "t", "body": b"x" * 100}])
    waiting.feed(message[:10])
    assert list(waiting) == []
    held = waiting.unpacker
    assert held is not None and waiting.buffered_bytes == 10
    for msgid in range(5):  # others decode meanwhile, with other unpackers
        other.feed(enc.request(msgid, "ping", []))
        assert other.unpacker is not held
        assert list(other) == [Request(msgid, "ping", [])]
    waiting.feed(message[10:])
    assert waiting.unpacker is held
    assert list(waiting) == [Request(3, "add", [{"topic": "t", "body": b"x" * 100}])]
    assert waiting.unpacker is None


def test_a_caller_that_stops_at_the_last_message_leaves_nothing_held() -> None:
    # The client's read loop returns as soon as its reply is decoded.
    decoder = Decoder()
    decoder.feed(enc.response(1, "a") + enc.response(2, "b"))
    for message in decoder:
        assert isinstance(message, Response)
        if message.msgid == 2:
            break
    assert decoder.unpacker is None
    assert decoder.buffered_bytes == 0


def test_a_caller_that_stops_early_keeps_the_rest_for_later() -> None:
    decoder = Decoder()
    decoder.feed(enc.response(1, "a") + enc.response(2, "b"))
    for _ in decoder:
        break
    assert decoder.unpacker is not None
    assert decoder.buffered_bytes == len(enc.response(2, "b"))
    assert list(decoder) == [Response(2, None, "b")]
    assert decoder.unpacker is None


def test_bytes_fed_during_the_last_yield_come_out_in_the_same_loop() -> None:
    decoder = Decoder()
    decoder.feed(enc.response(1, "a"))
    got = []
    for message in decoder:
        got.append(message)
        if len(got) == 1:
            decoder.feed(enc.response(2, "b"))
    assert got == [Response(1, None, "a"), Response(2, None, "b")]
    assert decoder.unpacker is None


def test_an_unpacker_whose_buffer_grew_is_freed_not_pooled() -> None:
    decoder = Decoder()
    big = enc.request(4, "add", [{"topic": "t", "body": b"y" * (UNPACKER_BUFFER_BYTES + 10)}])
    half = len(big) // 2
    decoder.feed(big[:half])
    assert list(decoder) == []
    grown = decoder.unpacker
    decoder.feed(big[half:])
    (request,) = list(decoder)
    assert isinstance(request, Request) and request.msgid == 4
    assert decoder.unpacker is None
    assert all(unpacker is not grown for unpacker in pool_of(decoder))
    # a chunk bigger than the buffer on its own, whole messages: not pooled either
    decoder.feed(big)
    grown = decoder.unpacker
    assert len(list(decoder)) == 1
    assert all(unpacker is not grown for unpacker in pool_of(decoder))


def test_the_pool_keeps_at_most_a_few_idle_unpackers() -> None:
    decoders = [Decoder() for _ in range(MAX_IDLE_UNPACKERS + 5)]
    for decoder in decoders:  # all mid-message at once: each holds its own
        decoder.feed(PING[:3])
        assert list(decoder) == []
    held = {id(decoder.unpacker) for decoder in decoders}
    assert len(held) == len(decoders)
    for decoder in decoders:
        decoder.feed(PING[3:])
        assert list(decoder) == [Request(1, "ping", [])]
    assert len(decoders[0]._pool.safe) == MAX_IDLE_UNPACKERS


def test_limits_are_not_shared_between_decoders_of_other_limits() -> None:
    small, default = Decoder(max_message_bytes=1024), Decoder()
    assert small._pool is not default._pool
    body = enc.request(5, "add", [{"body": b"z" * 2000}])
    with pytest.raises(ProtocolError) as info:
        decode(small, body)
    assert info.value.code == "too_large"
    assert len(decode(default, body)) == 1  # an unpacker of the 4 MiB limit


JUNK = [
    b"\xc1",
    b"\x91" * 1100 + b"\x00",  # nested too deep
    b"\x81\x91\x01\x01",  # an array as a map key
    b"\x94\x00\x01\xa1m\x91\xa2\xff\xfe",  # a str that is not UTF-8
    msgpack.packb([0, 1, "m", {"a": 1}]),  # params not an array
    PING[:3] + b"\xc1",  # junk mid-message
]


@pytest.mark.parametrize("junk", JUNK, ids=repr)
def test_an_error_never_reaches_the_next_decoder(junk: bytes) -> None:
    broken = Decoder()
    broken.feed(PING + junk)
    with pytest.raises(ProtocolError):
        list(broken)
    assert broken.unpacker is None
    for msgid in range(MAX_IDLE_UNPACKERS + 1):  # every pooled unpacker, in turn
        assert decode(Decoder(), enc.request(msgid, "ping", [])) == [Request(msgid, "ping", [])]


def test_an_error_names_the_decoders_own_stream_offset() -> None:
    busy = Decoder()
    for msgid in range(100):  # the pooled unpacker's own offset moves far ahead
        decode(busy, enc.request(msgid, "get", ["some-task-id"]))
    fresh = Decoder()
    with pytest.raises(ProtocolError) as info:
        decode(fresh, PING + b"\xc1")
    assert f"at stream offset {len(PING)}" in info.value.message


streams = st.lists(
    st.builds(
        lambda msgid, body: enc.request(msgid, "add", [{"body": body}]),
        st.integers(0, 1000),
        st.binary(max_size=300),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=100, deadline=None)
@given(st.lists(streams, min_size=2, max_size=4), st.data())
def test_interleaved_streams_decode_as_if_alone(
    sent: list[list[bytes]], data: st.DataObject
) -> None:
    """Several decoders fed pieces of their own streams in any order, each iterated after
    every feed: each yields exactly its own messages."""
    wanted = [Decoder().receive(b"".join(messages)) for messages in sent]
    decoders = [Decoder() for _ in sent]
    pending = [b"".join(messages) for messages in sent]
    got: list[list[Message]] = [[] for _ in sent]
    while any(pending):
        which = data.draw(st.sampled_from([i for i, left in enumerate(pending) if left]))
        size = data.draw(st.integers(1, len(pending[which])))
        piece, pending[which] = pending[which][:size], pending[which][size:]
        got[which] += decode(decoders[which], piece)
    assert got == wanted
    assert all(decoder.unpacker is None for decoder in decoders)


def test_decoders_in_threads_share_the_pool() -> None:
    errors: list[BaseException] = []
    stream = b"".join(enc.request(i, "get", [f"task-{i}"]) for i in range(200))

    def work() -> None:
        try:
            for _ in range(50):
                decoder, got = Decoder(), []
                for start in range(0, len(stream), 37):
                    got += decode(decoder, stream[start : start + 37])
                assert [message.msgid for message in got] == list(range(200))  # type: ignore[union-attr]
                assert decoder.unpacker is None
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(protocol._pools) <= protocol.MAX_POOLS


def test_a_chunk_that_ends_mid_message_frees_the_fast_unpacker() -> None:
    # Nested headers that claim the fast way's most entries, never finished: what the
    # fast unpacker preallocated for them goes with it; the safe way keeps the bytes.
    decoder = Decoder()
    decoder.feed(PING + b"\xdc\x00\x40" * 500)  # array16 headers of 64 entries
    assert list(decoder) == [Request(1, "ping", [])]
    fast = [unpacker for unpacker in decoder._pool.fast]
    assert decoder.unpacker is not None and decoder.unpacker not in fast
    assert decoder._skipper is not None  # the safe way's pair
    assert decoder.buffered_bytes == 1500


def test_a_container_beyond_the_fast_way_decodes_the_safe_way() -> None:
    decoder = Decoder()
    params = [list(range(protocol.FAST_CONTAINER_LEN + 1)), {str(i): i for i in range(100)}]
    stream = PING + enc.request(2, "m", params) + enc.request(3, "get", ["a"])
    assert decode(decoder, stream) == [
        Request(1, "ping", []),
        Request(2, "m", params),
        Request(3, "get", ["a"]),
    ]
    assert decoder.unpacker is None
    # and back on the fast way for the next chunk
    decoder.feed(PING)
    assert decoder._skipper is None
    assert list(decoder) == [Request(1, "ping", [])]


def test_bytes_fed_before_the_fast_chunk_was_read_keep_their_order() -> None:
    decoder = Decoder()
    decoder.feed(enc.response(1, "a") + enc.response(2, "b")[:5])
    decoder.feed(enc.response(2, "b")[5:] + enc.response(3, "c"))
    assert list(decoder) == [Response(1, None, "a"), Response(2, None, "b"), Response(3, None, "c")]
    assert decoder.unpacker is None
