"""Fuzz the wire protocol against a real daemon: random and mutated frames get error replies (or, when a
mutation happens to be a valid request, a normal answer), and the daemon keeps serving."""

from __future__ import annotations

import random

import msgpack
import pytest
import zmq

from mlxd_protocol import Client, decode

VALID_FRAMES = [
    {"v": 1, "type": "status"},
    {"v": 1, "type": "generate", "id": "g", "prompt": "Once upon a time", "max_tokens": 4},
    {
        "v": 1,
        "type": "generate",
        "id": "t",
        "prompt_tokens": [1, 403, 407],
        "max_tokens": 3,
        "sampling": {"temperature": 0.5, "seed": 3, "logit_bias": {5: 1.0}},
        "stop": ["x"],
    },
    {"v": 1, "type": "tokenize", "text": "hello"},
    {"v": 1, "type": "detokenize", "tokens": [403, 407]},
    {"v": 1, "type": "cancel", "id": "nobody"},
]
ODD_VALUES = [
    None,
    True,
    -1,
    0,
    2**63 - 1,
    -(2**63),
    1e308,
    float("nan"),
    "",
    "x" * 10000,
    b"\x00\xff",
    [],
    [None] * 5,
    {},
    {"a": {"b": {"c": [1, {"d": 2}]}}},
    list(range(2000)),
    "\u202e\ud7ff",
]


def mutate(rng: random.Random, frame: dict) -> bytes:
    choice = rng.randrange(6)
    if choice == 0:  # random bytes
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    packed = bytearray(msgpack.packb(frame))
    if choice == 1:  # flip bytes
        for _ in range(rng.randrange(1, 4)):
            packed[rng.randrange(len(packed))] = rng.randrange(256)
        return bytes(packed)
    if choice == 2:  # truncate
        return bytes(packed[: rng.randrange(len(packed))])
    changed = dict(frame)
    if choice == 3:  # a field gets an odd value
        changed[rng.choice(list(changed))] = rng.choice(ODD_VALUES)
    elif choice == 4:  # an unknown or misspelt field
        changed[rng.choice(["prompt_tokenz", "zzz", "sampling", "v", "type"])] = rng.choice(ODD_VALUES)
    else:  # wrong version or type
        changed[rng.choice(["v", "type"])] = rng.choice([0, 2, 99, "1", "status_result", "done", "ok", None])
    return msgpack.packb(changed, use_bin_type=rng.random() < 0.5)


def test_fuzzed_frames_never_stop_the_daemon(stories_daemon):
    rng = random.Random(1234)
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(stories_daemon)
    counts = {"error": 0, "answered": 0, "silent": 0}
    try:
        for _ in range(400):
            frame = mutate(rng, rng.choice(VALID_FRAMES))
            socket.send(frame)
            # drain what comes back for this frame (a valid generate streams; cancel has no reply)
            got_reply = False
            while socket.poll(300 if not got_reply else 100):
                reply = decode(socket.recv())
                got_reply = True
                if reply.TYPE == "error":
                    counts["error"] += 1
                    break
                if reply.TYPE in ("done", "status_result", "tokenize_result", "detokenize_result", "ok"):
                    counts["answered"] += 1
                    break
            if not got_reply:
                counts["silent"] += 1
    finally:
        socket.close()
    print(f"400 fuzzed frames: {counts}")
    assert counts["error"] > 200
    with Client(stories_daemon, timeout_s=5) as client:
        status = client.status()
        assert status.active == 0
        assert client.tokenize("Once upon a time")[:2] == [1, 403]


@pytest.mark.parametrize("size", [2**20, 30 * 2**20])
def test_huge_frames_are_refused(stories_daemon, size):
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(stories_daemon)
    try:
        socket.send(msgpack.packb({"v": 1, "type": "generate", "id": "h", "prompt": "a" * size}))
        assert socket.poll(20000)
        reply = decode(socket.recv())
        assert reply.TYPE == "error" and reply.code == "invalid_request"
    finally:
        socket.close()
    with Client(stories_daemon, timeout_s=5) as client:
        assert client.ping(2)
