"""mlxd over its socket: every request type, bad frames answered with errors, the daemon keeps serving."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
import zmq

from mlxd_protocol import (
    AsyncClient,
    Chunk,
    Client,
    DaemonError,
    Done,
    Generate,
    Sampling,
    decode,
    new_request_id,
)
from tests.daemon.conftest import STORIES

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason=f"{STORIES} is not present")


def raw_exchange(endpoint: str, frames: list[bytes], timeout_ms: int = 5000):
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    try:
        socket.send_multipart(frames)
        if not socket.poll(timeout_ms):
            return None
        return decode(socket.recv())
    finally:
        socket.close()


BAD_FRAMES = [
    ([b"\xc1\xff not msgpack"], "bad_frame"),
    ([msgpack.packb([1, 2, 3])], "bad_frame"),
    ([msgpack.packb({"type": "status"})], "bad_version"),
    ([msgpack.packb({"v": 99, "type": "status"})], "bad_version"),
    ([msgpack.packb({"v": 1, "type": "teleport"})], "unknown_type"),
    ([msgpack.packb({"v": 1, "type": "done", "id": "x", "finish_reason": "stop"})], "unknown_type"),
    ([msgpack.packb({"v": 1, "type": "generate", "id": "x", "prompt": "hi", "max_tokens": "ten"})], "invalid_request"),
    ([msgpack.packb({"v": 1, "type": "generate", "id": "x"})], "invalid_request"),
    ([msgpack.packb({"v": 1, "type": "generate", "id": "x", "prompt": ""})], "invalid_request"),
    ([msgpack.packb({"v": 1, "type": "generate", "id": "x", "prompt_tokens": [99999]})], "invalid_request"),
    (
        [msgpack.packb({"v": 1, "type": "generate", "id": "x", "prompt": "a", "sampling": {"top_p": 0}})],
        "invalid_request",
    ),
    ([msgpack.packb({"v": 1, "type": "detokenize", "tokens": [-1]})], "invalid_request"),
    ([b"one", b"two"], "bad_frame"),
]


@pytest.mark.parametrize("frames, code", BAD_FRAMES, ids=[code + str(i) for i, (_, code) in enumerate(BAD_FRAMES)])
def test_bad_frames_get_error_replies(stories_daemon, frames, code):
    reply = raw_exchange(stories_daemon, frames)
    assert reply is not None and reply.TYPE == "error", reply
    assert reply.code == code, reply.message


def test_daemon_still_answers_after_bad_input(stories_daemon):
    for frames, _ in BAD_FRAMES:
        raw_exchange(stories_daemon, frames)
    with Client(stories_daemon, timeout_s=5) as client:
        status = client.status()
        assert status.model.endswith("stories260K") and status.active == 0
        assert status.protocol_version == 1 and status.memory["rss_bytes"] > 0


def test_tokenize_detokenize_round_trip(stories_daemon):
    with Client(stories_daemon, timeout_s=5) as client:
        tokens = client.tokenize("Once upon a time")
        assert tokens[0] == 1 and len(tokens) == 5
        assert client.detokenize(tokens[1:]) == "Once upon a time"


def _run(client: Client, prompt: str, max_tokens: int = 40, **kwargs) -> Done:
    request = Generate(id=new_request_id(), prompt=prompt, max_tokens=max_tokens, **kwargs)
    replies = list(client.generate(request))
    done = replies[-1]
    assert isinstance(done, Done)
    assert "".join(r.text for r in replies[:-1]) == done.text
    return done


def test_greedy_output_equals_the_engine_loop(stories_daemon, stories_model):
    from mlxd_engine import Engine
    from mlxd_scheduler import generate_plain

    with Client(stories_daemon, timeout_s=30) as client:
        done = _run(client, "Once upon a time", 60)
    prompt = stories_model.tokenizer.encode("Once upon a time")
    assert done.tokens == generate_plain(Engine(stories_model, max_sequences=1), prompt, 60).tokens
    assert done.finish_reason == "length" and done.usage["completion_tokens"] == 60
    assert done.timings["predicted_n"] == 60


def test_eight_concurrent_requests_match_their_solo_runs(stories_daemon):
    prompts = [
        "Once upon a time",
        "Lily and Ben",
        "The cat sat",
        "Tom was sad",
        "One day, a bird",
        "The sun was hot",
        "Sue had a doll",
        "A big dog ran",
    ]
    with Client(stories_daemon, timeout_s=30) as client:
        solo = [_run(client, p, 48).tokens for p in prompts]

    async def together():
        async with AsyncClient(stories_daemon, timeout_s=60) as client:

            async def one(prompt):
                replies = [
                    r async for r in client.generate(Generate(id=new_request_id(), prompt=prompt, max_tokens=48))
                ]
                return replies[-1].tokens

            return await asyncio.gather(*(one(p) for p in prompts))

    assert asyncio.run(together()) == solo


def test_stop_strings_seeds_and_non_streaming(stories_daemon):
    with Client(stories_daemon, timeout_s=30) as client:
        full = _run(client, "Once upon a time", 60).text
        stopped = _run(client, "Once upon a time", 60, stop=["Lily"])
        assert stopped.finish_reason == "stop" and stopped.text == full[: full.index("Lily")]
        sampled = [
            _run(client, "Once upon a time", 30, sampling=Sampling(temperature=1.0, seed=5)).tokens for _ in range(2)
        ]
        assert sampled[0] == sampled[1]
        replies = list(
            client.generate(Generate(id=new_request_id(), prompt="Once upon a time", max_tokens=20, stream=False))
        )
        assert len(replies) == 1 and replies[0].text == full[: len(replies[0].text)] and len(replies[0].tokens) == 20


def test_cancel_ends_the_stream_and_frees_the_row(stories_daemon):
    with Client(stories_daemon, timeout_s=30) as client:
        request = Generate(id=new_request_id(), prompt="Once upon a time", max_tokens=400)
        stream = client.generate(request)
        next(stream)
        client.cancel(request.id)
        done = [r for r in stream if isinstance(r, Done)][-1]
        assert done.finish_reason == "cancelled"
        assert client.status().active == 0


def test_duplicate_running_id_is_refused_on_the_same_connection(stories_daemon):
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(stories_daemon)
    frame = msgpack.packb({"v": 1, "type": "generate", "id": "dup", "prompt": "Once upon a time", "max_tokens": 300})
    try:
        socket.send(frame)
        socket.send(frame)
        errors, finished = [], False
        while not finished and socket.poll(10000):
            reply = decode(socket.recv())
            if reply.TYPE == "error":
                errors.append(reply)
                socket.send(msgpack.packb({"v": 1, "type": "cancel", "id": "dup"}))
            finished = reply.TYPE == "done"
        assert finished and len(errors) == 1 and "already running" in errors[0].message
    finally:
        socket.close()


def test_sigterm_drains_in_flight_requests_then_stops():
    import signal
    import time

    from .conftest import STORIES, private_endpoint, start_daemon, stop_daemon

    endpoint = private_endpoint()
    process = start_daemon(endpoint, "-m", str(STORIES), "--drain-timeout", "20")
    try:
        with Client(endpoint, timeout_s=30) as client:
            request = Generate(id=new_request_id(), prompt="Once upon a time", max_tokens=480, ignore_eos=True)
            stream = client.generate(request)
            next(stream)
            process.send_signal(signal.SIGTERM)
            refused = None
            with Client(endpoint, timeout_s=5) as other:  # new work is refused once the signal is handled
                deadline = time.monotonic() + 5
                while refused is None and time.monotonic() < deadline:
                    try:
                        list(other.generate(Generate(id=new_request_id(), prompt="Lily", max_tokens=1)))
                    except DaemonError as error:
                        refused = error
            assert refused is not None and "shutting down" in refused.message
            done = [r for r in stream if isinstance(r, Done)][-1]
            assert done.finish_reason == "length" and len(done.tokens) == 480  # the running request finished
        assert process.wait(timeout=20) == 0
    finally:
        stop_daemon(process, endpoint)


def test_streamed_chunks_add_up_to_the_done(stories_daemon):
    """Chunks are coalesced in time (first one at once): together they carry every token and all the text."""
    with Client(stories_daemon, timeout_s=30) as client:
        replies = list(client.generate(Generate(id=new_request_id(), prompt="Once upon a time", max_tokens=80)))
    chunks, done = replies[:-1], replies[-1]
    assert isinstance(done, Done) and chunks and all(isinstance(c, Chunk) for c in chunks)
    assert chunks[0].tokens == done.tokens[:1]
    assert [t for c in chunks for t in c.tokens] == done.tokens
    assert "".join(c.text for c in chunks) == done.text
