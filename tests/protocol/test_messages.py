"""Wire types and codec: every message round-trips, every malformed frame is refused with the right code."""

import random
import subprocess
import sys

import msgpack
import pytest

from mlxd_protocol import (
    BAD_FRAME,
    BAD_VERSION,
    INVALID,
    MAX_FRAME_BYTES,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    UNKNOWN_TYPE,
    Cancel,
    Chunk,
    Detokenize,
    DetokenizeResult,
    Done,
    Embed,
    EmbedResult,
    Error,
    Generate,
    Hello,
    Message,
    Ok,
    Progress,
    ProtocolError,
    Sampling,
    Shutdown,
    Speculative,
    Status,
    StatusRequest,
    Tick,
    TickRow,
    Tokenize,
    TokenizeResult,
    decode,
    encode,
    error_reply,
)
from mlxd_protocol.field_checks import MAX_LIST_ITEMS, FieldError

FULL_GENERATE = Generate(
    id="gen-1",
    messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    chat=True,
    system="override",
    max_tokens=64,
    stop=["\n\n", "END"],
    stream=False,
    sampling=Sampling(
        temperature=0.7,
        top_k=40,
        top_p=0.9,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logit_bias={0: -100.0, 42: 2.5},
        seed=1234,
        logprobs=5,
    ),
    speculative=Speculative(kind="prompt-lookup", max_draft=8),
    add_special_tokens=False,
)

ONE_OF_EACH: list[Message] = [
    Hello(client="mlx-generate", id="h"),
    StatusRequest(id="s"),
    FULL_GENERATE,
    Generate(id="gen-2", prompt="Once upon a time"),
    Generate(id="gen-3", prompt_tokens=[1, 2, 3], speculative=Speculative()),
    Cancel(id="gen-1"),
    Tokenize(text="hello", id="t"),
    Tokenize(messages=[{"role": "user", "content": "hi"}], add_special_tokens=False),
    Detokenize(tokens=[5, 6, 7], id="d"),
    Embed(texts=["hello", "world"], pooling="last", id="e"),
    Embed(token_inputs=[[1, 2], [3]], normalize=False, add_special_tokens=False),
    Generate(id="gen-4", messages=[{"role": "assistant", "content": "Once"}], continue_final_message=True),
    Shutdown(id="x"),
    Status(
        model="mlxd-qwen3-tiny",
        protocol_version=1,
        daemon_version="0.1.0",
        uptime_s=12.5,
        active=2,
        queued=1,
        max_batch=8,
        memory={"rss_bytes": 123456},
        options={"speculative": "prompt-lookup"},
        totals={"requests": 10},
        pid=4242,
        id="s",
    ),
    Chunk(id="gen-1", tokens=[10, 11], text="ab", logprobs=[{"token": 10, "logprob": -0.1}]),
    Progress(id="gen-1", total=100, cache=20, processed=52, time_ms=3.5),
    Done(
        id="gen-1",
        finish_reason="length",
        text="abc",
        tokens=[10, 11, 12],
        usage={"prompt_tokens": 3},
        timings={"ttft_s": 0.01},
    ),
    Error(id=None, code=INVALID, message="nope"),
    TokenizeResult(tokens=[1, 2], id="t"),
    DetokenizeResult(text="hi", id="d"),
    EmbedResult(embeddings=[[0.5, -0.25], [1.0, 0.0]], token_counts=[2, 1], pooling="mean", id="e"),
    Ok(id="x"),
    Tick(
        tick=7,
        batch=2,
        pipelined=True,
        duration_ms=1.25,
        prefill_tokens=0,
        steps=4,
        rows=[
            TickRow(request_id="a:1", action="decode", tokens=4),
            TickRow(request_id="a:2", action="verify", drafted=8, accepted=5),
        ],
    ),
]


def frame(**fields) -> bytes:
    """A raw frame, bypassing encode's checks (what a buggy or hostile peer could send)."""
    return msgpack.packb(fields, use_bin_type=True)


def generate_frame(**overrides) -> bytes:
    return frame(**{"v": 1, "type": "generate", "id": "g1", "prompt": "hi", **overrides})


@pytest.mark.parametrize("message", ONE_OF_EACH, ids=lambda message: type(message).__name__)
def test_every_message_round_trips(message):
    decoded = decode(encode(message))
    assert type(decoded) is type(message)
    assert decoded == message


def test_a_tick_row_with_an_unknown_action_is_refused():
    with pytest.raises(ProtocolError, match="action: must be one of"):
        encode(Tick(tick=1, batch=1, pipelined=False, rows=[TickRow(request_id="a", action="dance")]))
    raw = frame(
        v=1, type="tick", tick=1, batch=1, pipelined=False, rows=[{"request_id": "a", "action": "decode", "x": 1}]
    )
    with pytest.raises(ProtocolError, match="unknown field rows\\[0\\].'x'"):
        decode(raw)


def test_the_round_trip_cases_cover_every_message_type():
    assert {message.TYPE for message in ONE_OF_EACH} == set(MESSAGE_TYPES)


def test_frame_is_a_flat_map_with_version_type_and_fields():
    raw = msgpack.unpackb(encode(Cancel(id="abc")), raw=False)
    assert raw == {"v": PROTOCOL_VERSION, "type": "cancel", "id": "abc"}


def test_nested_sampling_is_a_map_with_integer_logit_bias_keys():
    raw = msgpack.unpackb(encode(FULL_GENERATE), raw=False, strict_map_key=False)
    assert raw["sampling"]["logit_bias"] == {0: -100.0, 42: 2.5}
    assert raw["speculative"] == {"kind": "prompt-lookup", "max_draft": 8}
    decoded = decode(encode(FULL_GENERATE))
    assert isinstance(decoded.sampling, Sampling) and decoded.sampling.logit_bias == {0: -100.0, 42: 2.5}


def test_defaults_fill_missing_optional_fields_and_ints_become_floats():
    message = decode(generate_frame(sampling={"temperature": 1}))
    assert message.max_tokens == 256 and message.stream is True and message.stop == []
    assert message.sampling.temperature == 1.0 and type(message.sampling.temperature) is float
    assert message.speculative is None


@pytest.mark.parametrize(
    "data, code, needle",
    [
        (b"\xc1\xc1\xc1", BAD_FRAME, "msgpack"),
        (msgpack.packb([1, 2, 3]), BAD_FRAME, "got list"),
        (msgpack.packb("status"), BAD_FRAME, "got str"),
        (frame(type="status"), BAD_VERSION, "supported: 1"),
        (frame(v=2, type="status"), BAD_VERSION, "protocol version 2"),
        (frame(v="1", type="status"), BAD_VERSION, "supported: 1"),
        (frame(v=True, type="status"), BAD_VERSION, "supported: 1"),
        (frame(v=1, type="launch_missiles"), UNKNOWN_TYPE, "known: cancel"),
        (frame(v=1), UNKNOWN_TYPE, "None"),
        (generate_frame(bogus=1), INVALID, "unknown field 'bogus'"),
        (generate_frame(sampling={"bogus": 1}), INVALID, "sampling.'bogus'"),
        (generate_frame(max_tokens="10"), INVALID, "max_tokens: expected int, got str"),
        (generate_frame(max_tokens=True), INVALID, "max_tokens: expected int, got bool"),
        (generate_frame(max_tokens=None), INVALID, "max_tokens: expected int, got nil"),
        (generate_frame(max_tokens=0), INVALID, "max_tokens"),
        (generate_frame(prompt=None, prompt_tokens=["a"]), INVALID, "prompt_tokens[0]: expected int, got str"),
        (generate_frame(prompt=None, prompt_tokens=[1, -2]), INVALID, "token ids must be >= 0"),
        (generate_frame(prompt=None, prompt_tokens=[]), INVALID, "at least one token"),
        (generate_frame(prompt=""), INVALID, "prompt: must not be empty"),
        (generate_frame(prompt=b"bytes"), INVALID, "prompt: expected str, got bytes"),
        (generate_frame(prompt_tokens=[1]), INVALID, "exactly one of prompt, prompt_tokens, messages"),
        (generate_frame(prompt=None), INVALID, "got none"),
        (generate_frame(prompt=None, messages=[{"role": "user"}]), INVALID, "messages[0].content"),
        (generate_frame(prompt=None, messages=[{1: "user"}]), INVALID, "keys must be str"),
        (generate_frame(sampling=[0.5]), INVALID, "expected map (Sampling), got list"),
        (generate_frame(sampling={"temperature": True}), INVALID, "temperature: expected float, got bool"),
        (generate_frame(sampling={"temperature": -1.0}), INVALID, "temperature: must be >= 0"),
        (generate_frame(sampling={"top_p": 0.0}), INVALID, "top_p"),
        (generate_frame(sampling={"logit_bias": {"7": 1.0}}), INVALID, "logit_bias key '7': expected int"),
        (generate_frame(sampling={"logprobs": 1000}), INVALID, "logprobs"),
        (generate_frame(speculative={"kind": "medusa"}), INVALID, "speculative.kind"),
        (generate_frame(draft_key=""), INVALID, "draft_key: 1 to 256"),
        (generate_frame(draft_key="k" * 257), INVALID, "draft_key: 1 to 256"),
        (generate_frame(shared_drafts="no"), INVALID, "shared_drafts: expected bool"),
        (generate_frame(stop=[""]), INVALID, "stop"),
        (generate_frame(id=7), INVALID, "id: expected str, got int"),
        (generate_frame(id=""), INVALID, "id: must be 1 to"),
        (frame(v=1, type="generate", prompt="hi"), INVALID, "missing field id"),
        (frame(v=1, type="status", **{"id": "s", "extra": 1}), INVALID, "unknown field 'extra'"),
        (frame(v=1, type="tokenize", text="a", messages=[{"role": "user", "content": "b"}]), INVALID, "exactly one"),
        (frame(v=1, type="done", id="g", finish_reason="bored"), INVALID, "finish_reason"),
    ],
)
def test_malformed_frames_are_refused_with_the_right_code(data, code, needle):
    with pytest.raises(ProtocolError) as caught:
        decode(data)
    assert caught.value.code == code
    assert needle in caught.value.message
    reply = caught.value.to_reply()
    assert isinstance(reply, Error) and reply.code == code and reply.message == caught.value.message
    assert decode(encode(reply)) == reply  # the daemon can always send the Error back


def test_protocol_error_carries_the_frames_id_for_the_reply():
    with pytest.raises(ProtocolError) as caught:
        decode(generate_frame(id="abc", max_tokens="ten"))
    assert caught.value.request_id == "abc"
    assert caught.value.to_reply().id == "abc"
    assert caught.value.to_reply("other").id == "other"


def test_error_reply_builds_an_error():
    assert error_reply(INVALID, "bad", id="r1") == Error(id="r1", code=INVALID, message="bad")


def test_oversized_token_lists_and_frames_are_refused():
    with pytest.raises(ProtocolError) as caught:
        decode(generate_frame(prompt=None, prompt_tokens=[1] * (MAX_LIST_ITEMS + 1)))
    assert caught.value.code == INVALID and "at most" in caught.value.message
    with pytest.raises(ProtocolError) as caught:
        decode(b"\x90" * (MAX_FRAME_BYTES + 1))
    assert caught.value.code == BAD_FRAME


def test_a_million_token_prompt_is_accepted():
    tokens = list(range(MAX_LIST_ITEMS))
    assert decode(encode(Generate(id="big", prompt_tokens=tokens))).prompt_tokens == tokens


def test_encode_refuses_what_decode_would_refuse():
    with pytest.raises(ProtocolError) as caught:
        encode(Generate(id="g", prompt="a", prompt_tokens=[1]))
    assert caught.value.code == INVALID
    with pytest.raises(ProtocolError, match="max_tokens: expected int, got str"):
        encode(Generate(id="g", prompt="a", max_tokens="5"))
    with pytest.raises(ProtocolError, match="sampling.seed"):
        encode(Generate(id="g", prompt="a", sampling=Sampling(seed=-1)))
    with pytest.raises(TypeError):
        encode(Sampling())  # nested value, not a message


def test_unknown_error_codes_still_decode():
    # Clients must be able to read codes added by a newer daemon (they treat them as internal).
    assert decode(encode(Error(id="x", code="some_new_code", message="m"))).code == "some_new_code"


def test_garbage_never_raises_anything_but_protocol_error():
    rng = random.Random(1234)
    valid = encode(FULL_GENERATE)
    candidates = [bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64))) for _ in range(300)]
    candidates += [valid[:cut] for cut in range(len(valid))]
    candidates += [
        bytes(byte ^ 0xFF if index == position else byte for index, byte in enumerate(valid))
        for position in range(0, len(valid), 3)
    ]
    for data in candidates:
        try:
            assert isinstance(decode(data), Message)
        except ProtocolError:
            pass


@pytest.mark.integration  # starts a process
def test_messages_is_plain_data_the_codec_imports_and_the_package_never_imports_mlx():
    import ast
    import inspect

    from mlxd_protocol import codec, messages

    tree = ast.parse(inspect.getsource(messages))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    # plain data: the codes, the nested values, the type and value rules, nothing of the codec or the clients
    protocol_leaves = {"codes", "values", "field_checks", "request_checks", "sampling_rules"}
    assert imported == {"dataclasses", "typing"} | protocol_leaves, imported
    assert not hasattr(messages, "decode") and not hasattr(messages, "ProtocolError")
    assert codec.PROTOCOL_VERSION is messages.PROTOCOL_VERSION and codec.MESSAGE_TYPES is messages.MESSAGE_TYPES
    code = "import sys, mlxd_protocol; print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env={"PYTHONPATH": ":".join(sys.path)}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_progress_and_return_progress_rules():
    with pytest.raises(FieldError, match="progress"):
        Progress(id="g", total=10, cache=5, processed=4, time_ms=0.0).validate()
    with pytest.raises(FieldError, match="return_progress"):
        Generate(id="g", prompt="hi", stream=False, return_progress=True).validate()
    Generate(id="g", prompt="hi", return_progress=True).validate()


def test_the_first_token_outside_the_vocabulary_is_named_wherever_it_is():
    """The one rule for token ids a request sends (prompt tokens, embedding inputs, detokenize)."""
    from mlxd_protocol.sampling_rules import token_outside_vocabulary

    assert token_outside_vocabulary([0, 5, 9], 10) is None and token_outside_vocabulary([], 10) is None
    assert token_outside_vocabulary([3, 10, 12], 10) == 10
    assert token_outside_vocabulary([3, 12, -1], 10) == 12  # the first, not the smallest or largest
    assert token_outside_vocabulary([4, -2], 10) == -2
