"""One client interface, two implementations: LocalClient (the daemon's core in this process) against the
socket Client and a real mlxd on stories260K; the typed tick trace through Client.subscribe_ticks (and
AsyncClient.subscribe_ticks)."""

from __future__ import annotations

import asyncio
import time

import pytest

from mlxd_protocol import (
    INVALID,
    AsyncClient,
    Chunk,
    Client,
    DaemonClient,
    DaemonError,
    Done,
    Generate,
    LocalClient,
    ProtocolError,
    Sampling,
    Speculative,
    Tick,
    TickRow,
    new_request_id,
)

from .conftest import STORIES

pytestmark = pytest.mark.skipif(not STORIES.is_dir(), reason=f"{STORIES} is not present")

COPY_PROMPT = "Lily and Ben went to the park. Lily and Ben went to the park. Lily and Ben went to"


def request(prompt: str = "Once upon a time", **fields) -> Generate:
    return Generate(id=new_request_id(), prompt=prompt, **{"max_tokens": 24, **fields})


def replies(client, message: Generate) -> tuple[list[Chunk], Done]:
    *chunks, done = list(client.generate(message))
    return chunks, done


@pytest.fixture(scope="module")
def local():
    from mlxd_daemon.local import local_client
    from mlxd_daemon.options import DaemonOptions

    # what the stories_daemon fixture runs: mlxd -m STORIES --max-batch 8
    with local_client(DaemonOptions(model=str(STORIES), max_batch=8)) as client:
        yield client


def test_both_clients_implement_the_one_interface(local, stories_daemon):
    with Client(stories_daemon) as remote:
        assert isinstance(remote, DaemonClient) and isinstance(local, DaemonClient)
        assert isinstance(local, LocalClient)


def test_local_client_runs_what_the_daemon_runs(local, stories_daemon):
    """Same options (mlxd's command-line defaults are DaemonOptions' defaults), same replies."""
    with Client(stories_daemon, timeout_s=60) as remote:
        remote_options = remote.status().options
        local_options = local.status().options
        assert {k: v for k, v in local_options.items() if k != "endpoint"} == {
            k: v for k, v in remote_options.items() if k != "endpoint"
        }
        for message in (
            request(),
            request("Tom had a ball", sampling=Sampling(temperature=0.8, seed=3)),
            request(stream=False, stop=["."]),
        ):
            remote_chunks, remote_done = replies(remote, message)
            local_chunks, local_done = replies(local, message)
            assert local_done.tokens == remote_done.tokens and local_done.text == remote_done.text
            assert local_done.finish_reason == remote_done.finish_reason
            assert "".join(c.text for c in local_chunks) == local_done.text or not message.stream
            assert bool(local_chunks) == bool(remote_chunks) == message.stream
        assert local.tokenize("Once upon a time") == remote.tokenize("Once upon a time")


def test_local_client_is_built_from_the_daemon_options():
    from mlxd_daemon.local import local_client

    with local_client(model=str(STORIES), max_batch=1, draft_kind="prompt-lookup") as client:
        assert client.status().options["draft_kind"] == "prompt-lookup"
        _, done = replies(client, request(COPY_PROMPT, max_tokens=40))
        assert done.timings["draft_kind"] == "prompt-lookup"  # the daemon's speculative default applied
    with pytest.raises(DaemonError) as caught:
        local_client(model=str(STORIES), draft_kind="prompt-lookup", draft_model="some/model")
    assert caught.value.code == INVALID
    with pytest.raises(DaemonError) as caught:
        local_client(model="/nonexistent/model")
    assert caught.value.code == "not_found"


def test_local_client_refuses_and_cancels_like_the_socket_client(local):
    with pytest.raises(ProtocolError):
        local.generate(Generate(id="x", prompt="hi", max_tokens=0))  # the codec's checks, before anything runs
    with pytest.raises(DaemonError) as caught:
        list(local.generate(Generate(id=new_request_id(), prompt_tokens=[10**6])))
    assert caught.value.code == INVALID
    stream = local.generate(request(max_tokens=400, speculative=Speculative(kind="none")))
    assert isinstance(next(stream), Chunk)
    stream.close()  # leaving early cancels: the row is free again
    status = local.status()
    assert status.active == 0 and status.queued == 0 and status.memory["kv"]["slots_free"] == 8


def test_subscribe_ticks_yields_typed_ticks(stories_daemon):
    with Client(stories_daemon, timeout_s=60) as client, client.subscribe_ticks(idle_timeout_s=30) as ticks:
        time.sleep(1.0)  # the subscription reaches the daemon's publisher
        replies(client, request(max_tokens=16))
        seen = [next(ticks) for _ in range(3)]
    assert all(isinstance(tick, Tick) and all(isinstance(row, TickRow) for row in tick.rows) for tick in seen)
    actions = {row.action for tick in seen for row in tick.rows}
    assert actions & {"prefill", "first-token", "prime", "decode"}, actions


def test_async_subscribe_ticks_awaits_typed_ticks(stories_daemon):
    def generate_once() -> None:
        with Client(stories_daemon, timeout_s=60) as client:
            replies(client, request(max_tokens=16))

    async def watch() -> tuple[Tick | None, list[Tick]]:
        async with AsyncClient(stories_daemon, timeout_s=60) as client:
            subscription = client.subscribe_ticks()
            try:
                idle = await subscription.receive(timeout_s=0.5)  # nothing runs: no tick, and no hang
                generation = asyncio.create_task(asyncio.to_thread(generate_once))
                seen = [await subscription.receive(timeout_s=30) for _ in range(3)]
                await generation
            finally:
                subscription.close()
                subscription.close()  # twice is fine
        return idle, seen

    idle, seen = asyncio.run(watch())
    assert idle is None
    assert all(isinstance(tick, Tick) and all(isinstance(row, TickRow) for row in tick.rows) for tick in seen)


def test_a_repeated_chat_prefix_is_taken_from_the_prefix_cache(local):
    """The daemon's default prefix cache: the same prompt again reuses all but its last token, reports it in
    usage and timings, gives the same tokens, and shows in the status."""
    prompt = "Once upon a time there was a little dog named Max. Max liked to run in the park with his friends"
    _, first = replies(local, request(prompt, speculative=Speculative(kind="none")))
    _, second = replies(local, request(prompt, speculative=Speculative(kind="none")))
    assert second.tokens == first.tokens
    prompt_tokens = second.usage["prompt_tokens"]
    assert second.usage["cached_tokens"] == second.timings["cache_n"] == prompt_tokens - 1
    assert second.timings["prompt_n"] == 1
    cache = local.status().memory["kv"]["prefix_cache"]
    assert cache["entries"] >= 1 and cache["hits"] >= 1 and cache["tokens_saved"] >= prompt_tokens - 1
    assert 0 < cache["bytes"] <= cache["budget_bytes"]
