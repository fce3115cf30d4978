"""The daemon's Embed on the embedded model: computed between scheduler ticks without changing a running
generation, refused past the context or the vocabulary and while draining; plus Generate's
continue_final_message and tool_choice "none" on a model without a tool format."""

from __future__ import annotations

import numpy as np
import pytest

from mlxd_engine import load
from mlxd_protocol import (
    INVALID,
    OVERLOADED,
    Chunk,
    DaemonError,
    Done,
    Embed,
    EmbedResult,
    Error,
    Generate,
    ProtocolError,
    decode,
    encode,
    new_request_id,
)

from .tool_model import EMBEDDED, WEATHER_TOOL

MESSAGES = [{"role": "user", "content": "Repeat after me: the cat sat on the mat."}]
LONG_INPUT = list(range(3, 83))  # 80 tokens: five forwards of 16


@pytest.fixture(scope="module")
def loaded():
    return load(EMBEDDED)


def make_core(loaded, **options):
    from mlxd_daemon.core import DaemonCore
    from mlxd_daemon.options import DaemonOptions

    sent: list = []
    core = DaemonCore(
        loaded,
        DaemonOptions(model=str(EMBEDDED), prefill_chunk=16, stream_interval_s=0.0, **options),
        lambda identity, message: sent.append(decode(encode(message))),
    )
    return core, sent


def run_until_quiet(core) -> None:
    while core.has_work:
        core.turn()


def generation(max_tokens: int = 96) -> Generate:
    return Generate(id=new_request_id(), prompt="Once upon a time", max_tokens=max_tokens, ignore_eos=True)


def test_embed_runs_between_ticks_and_leaves_the_generation_unchanged(loaded):
    core, sent = make_core(loaded)
    alone = generation()
    core.handle(b"c", alone)
    run_until_quiet(core)
    reference = [reply for reply in sent if isinstance(reply, Done)][0]
    (alone_vector,) = _embed_alone(loaded)

    sent.clear()
    beside = generation()
    embed = Embed(token_inputs=[LONG_INPUT], id="e1")
    core.handle(b"c", beside)
    core.turn()  # the prompt goes in and the first token comes out before the Embed arrives
    assert core.handle(b"c", embed) is None
    run_until_quiet(core)
    order = [type(reply) for reply in sent]
    embedded_at = order.index(EmbedResult)
    assert Chunk in order[:embedded_at] and Chunk in order[embedded_at:]  # decoding went on around the forwards
    done = [reply for reply in sent if isinstance(reply, Done)][0]
    assert done.tokens == reference.tokens
    result = sent[embedded_at]
    assert result.id == "e1" and result.token_counts == [len(LONG_INPUT)] and result.pooling == "mean"
    np.testing.assert_allclose(result.embeddings[0], alone_vector, atol=1e-6)
    core.close()


def _embed_alone(loaded) -> list[list[float]]:
    core, sent = make_core(loaded)
    core.handle(b"c", Embed(token_inputs=[LONG_INPUT], id="alone"))
    run_until_quiet(core)
    core.close()
    return sent[-1].embeddings


@pytest.mark.parametrize(
    "message, words",
    [
        (Embed(token_inputs=[[5] * 16385], id="x"), "16384 tokens"),
        (Embed(token_inputs=[[1, 99999]], id="x"), "outside the vocabulary"),
    ],
)
def test_refusals_name_the_limit(loaded, message, words):
    core, sent = make_core(loaded)
    reply = core.handle(b"c", message)
    assert isinstance(reply, Error) and reply.code == INVALID and words in reply.message
    core.close()


def test_draining_refuses_embed(loaded):
    core, _ = make_core(loaded)
    core.draining = True
    reply = core.handle(b"c", Embed(texts=["hello"], id="x"))
    assert isinstance(reply, Error) and reply.code == OVERLOADED
    core.close()


def test_texts_are_tokenized_as_tokenize_does(loaded):
    from mlxd_daemon.local import local_client

    with local_client(model=str(EMBEDDED)) as client:
        tokens = client.tokenize(text="the cat sat")
        by_text = client.embed(texts=["the cat sat"], pooling="last")
        by_tokens = client.embed(token_inputs=[tokens], pooling="last")
        assert by_text.token_counts == [len(tokens)] and by_text.pooling == "last"
        np.testing.assert_allclose(by_text.embeddings, by_tokens.embeddings, atol=1e-6)
        per_token = client.embed(token_inputs=[tokens], pooling="none")
        assert len(per_token.embeddings) == len(tokens)
        assert abs(np.linalg.norm(per_token.embeddings[-1]) - 1) > 1e-3  # per-token vectors are not normalized
        with pytest.raises(DaemonError, match="the assistant's"):
            list(client.generate(Generate(id=new_request_id(), messages=MESSAGES, continue_final_message=True)))
        plain = list(client.generate(Generate(id=new_request_id(), messages=MESSAGES, max_tokens=8)))[-1]
        no_call = list(
            client.generate(
                Generate(id=new_request_id(), messages=MESSAGES, max_tokens=8, tools=[WEATHER_TOOL], tool_choice="none")
            )
        )[-1]
        assert no_call.text == plain.text and no_call.tool_calls is None


def test_protocol_rules_of_embed():
    for bad in (
        Embed(id="x"),
        Embed(texts=["a"], token_inputs=[[1]], id="x"),
        Embed(texts=[], id="x"),
        Embed(token_inputs=[[]], id="x"),
        Embed(texts=["a"], pooling="max", id="x"),
        Embed(texts=["a"] * 2049, id="x"),
        Generate(id="g", prompt="a", continue_final_message=True),
    ):
        with pytest.raises(ProtocolError):
            encode(bad)
