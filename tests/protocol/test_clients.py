"""Blocking and asyncio clients against a fake daemon (a ROUTER in a thread) on an ipc socket."""

import asyncio
import socket
import threading
import time

import pytest
import zmq

from mlxd_protocol import (
    DISCONNECTED,
    INVALID,
    AsyncClient,
    Cancel,
    Chunk,
    DaemonError,
    DaemonTimeout,
    Detokenize,
    DetokenizeResult,
    Done,
    Error,
    Generate,
    Hello,
    Ok,
    Shutdown,
    Status,
    StatusRequest,
    Tokenize,
    TokenizeResult,
    decode,
    encode,
)
from mlxd_protocol.async_client import CLIENT_CLOSED
from mlxd_protocol.client import Client
from mlxd_protocol.client_common import something_listens

STATUS_FIELDS = dict(
    model="fake",
    protocol_version=1,
    daemon_version="test",
    uptime_s=1.0,
    active=0,
    queued=0,
    max_batch=4,
    memory={"rss_bytes": 1},
    options={},
    totals={},
    pid=1,
)


class FakeDaemon(threading.Thread):
    """Answers like mlxd, with special prompts: "boom" -> Error, "hang" -> one chunk then silence,
    "endless" -> chunks until cancelled; others -> 3 chunks + Done. Streams advance round-robin, one
    reply each per turn, once ``batch`` generates are waiting (so concurrent streams interleave)."""

    def __init__(self, endpoint: str, silent: bool = False, batch: int = 1):
        super().__init__(daemon=True)
        self.endpoint, self.silent, self.batch = endpoint, silent, batch
        self.received: list = []
        self.cancels: list[str] = []
        self.sent_ids: list[str] = []
        self.streams: dict[str, tuple[bytes, str, int]] = {}  # id -> (identity, prompt, replies sent)
        self._stopping = threading.Event()
        self._bound = threading.Event()

    def __enter__(self):
        self.start()
        assert self._bound.wait(5)
        return self

    def __exit__(self, *exc_info):
        self._stopping.set()
        self.join(5)

    def run(self):
        context = zmq.Context()
        router = context.socket(zmq.ROUTER)
        router.linger = 0
        router.bind(self.endpoint)
        self._bound.set()
        try:
            while not self._stopping.is_set():
                if router.poll(5):
                    while router.poll(0):
                        identity, frame = router.recv_multipart()
                        self.handle(router, identity, decode(frame))
                if len(self.streams) >= self.batch:
                    self.batch = 1
                    self.advance_streams(router)
        finally:
            router.close()
            context.term()

    def send(self, router, identity, reply):
        self.sent_ids.append(reply.id)
        router.send_multipart([identity, encode(reply)])

    def handle(self, router, identity, request):
        self.received.append(request)
        if isinstance(request, Cancel):
            self.cancels.append(request.id)
            if request.id in self.streams:
                del self.streams[request.id]
                self.send(router, identity, Done(id=request.id, finish_reason="cancelled"))
            return
        if self.silent:
            return
        if isinstance(request, (StatusRequest, Hello)):
            self.send(router, identity, Status(**STATUS_FIELDS, id=request.id))
        elif isinstance(request, Tokenize):
            self.send(router, identity, TokenizeResult(tokens=[ord(c) for c in request.text], id=request.id))
        elif isinstance(request, Detokenize):
            # Stale replies first (another id, a finished stream): the client must skip them.
            self.send(router, identity, TokenizeResult(tokens=[1], id="someone-else"))
            self.send(router, identity, Chunk(id="old-stream", tokens=[1], text="x"))
            self.send(router, identity, DetokenizeResult(text="".join(map(chr, request.tokens)), id=request.id))
        elif isinstance(request, Shutdown):
            self.send(router, identity, Ok(id=request.id))
        elif isinstance(request, Generate) and request.prompt == "boom":
            self.send(router, identity, Error(id=request.id, code=INVALID, message="boom is not a prompt"))
        elif isinstance(request, Generate):
            self.streams[request.id] = (identity, request.prompt, 0)

    def advance_streams(self, router):
        for request_id, (identity, prompt, sent) in list(self.streams.items()):
            if prompt == "hang" and sent == 1:
                continue
            if sent == 3 and prompt != "endless":
                del self.streams[request_id]
                self.send(router, identity, Done(id=request_id, finish_reason="length", usage={"completion_tokens": 3}))
                continue
            self.streams[request_id] = (identity, prompt, sent + 1)
            self.send(router, identity, Chunk(id=request_id, tokens=[sent], text=f"{prompt}:{sent}"))


@pytest.fixture
def endpoint(tmp_path):
    return f"ipc://{tmp_path}/fake.sock"


def wait_until(condition, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


async def async_wait_until(condition, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


# ---- blocking client -----------------------------------------------------------------------


def test_blocking_unary_calls(endpoint):
    with FakeDaemon(endpoint) as daemon, Client(endpoint, timeout_s=2.0) as client:
        status = client.status()
        assert isinstance(status, Status) and status.model == "fake"
        assert status.id == daemon.received[-1].id  # every request got an id, echoed back
        assert client.hello("test").pid == 1
        assert client.tokenize("hi") == [104, 105]
        assert client.detokenize([104, 105]) == "hi"  # stale replies for other ids are skipped
        client.shutdown()
        assert client.ping(1.0)


def test_blocking_generate_streams_chunks_then_done(endpoint):
    with FakeDaemon(endpoint), Client(endpoint, timeout_s=2.0) as client:
        replies = list(client.generate(Generate(id="g1", prompt="p")))
    assert [reply.text for reply in replies[:-1]] == ["p:0", "p:1", "p:2"]
    assert isinstance(replies[-1], Done) and replies[-1].finish_reason == "length"
    assert all(reply.id == "g1" for reply in replies)


def test_blocking_generate_raises_the_daemons_error(endpoint):
    with FakeDaemon(endpoint) as daemon, Client(endpoint, timeout_s=2.0) as client:
        with pytest.raises(DaemonError) as caught:
            list(client.generate(Generate(id="g1", prompt="boom")))
        assert caught.value.code == INVALID and "boom" in caught.value.message
        assert daemon.cancels == []  # an Error ends the request: nothing to cancel


def test_blocking_timeouts_and_ping_against_a_silent_daemon(endpoint):
    with FakeDaemon(endpoint, silent=True), Client(endpoint, timeout_s=0.2) as client:
        started = time.monotonic()
        with pytest.raises(DaemonTimeout):
            client.status()
        assert time.monotonic() - started < 1.0
        assert client.ping(0.1) is False


def test_ping_is_false_when_nobody_listens(endpoint):
    with Client(endpoint, timeout_s=0.1) as client:
        assert client.ping(0.1) is False


def test_a_ping_where_nothing_can_listen_answers_without_waiting_out_its_timeout(endpoint, tmp_path):
    # each daemon start and each autostart pings first: a missing socket, a stale one or a refusing port
    # must not cost the ping's whole timeout
    with Client(endpoint) as client:
        started = time.monotonic()
        assert client.ping(30.0) is False
        assert time.monotonic() - started < 10.0
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(stale))  # the file a killed daemon leaves behind: nothing accepts on it
    assert stale.exists() and not something_listens(f"ipc://{stale}")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))  # a port held but not listening refuses connections
        assert not something_listens(f"tcp://127.0.0.1:{held.getsockname()[1]}")
        held.listen()
        assert something_listens(f"tcp://127.0.0.1:{held.getsockname()[1]}")
    with FakeDaemon(endpoint), Client(endpoint, timeout_s=2.0) as client:
        assert something_listens(endpoint) and client.ping(1.0)
    # a host name the resolver cannot even encode (a label over 63 characters): unsure, and the ping never raises
    odd = f"tcp://{'a' * 70}.example:5555"
    assert something_listens(odd)
    with Client(odd, timeout_s=0.5) as client:
        assert client.ping(0.1) is False


def test_blocking_generate_times_out_between_messages_and_cancels(endpoint):
    with FakeDaemon(endpoint) as daemon, Client(endpoint, timeout_s=0.3) as client:
        stream = client.generate(Generate(id="g-hang", prompt="hang"))
        assert next(stream).text == "hang:0"
        with pytest.raises(DaemonTimeout):
            next(stream)
        assert wait_until(lambda: daemon.cancels == ["g-hang"])


def test_blocking_generate_abandoned_early_sends_cancel(endpoint):
    with FakeDaemon(endpoint) as daemon, Client(endpoint, timeout_s=2.0) as client:
        for _ in client.generate(Generate(id="g-endless", prompt="endless")):
            break
        assert wait_until(lambda: daemon.cancels == ["g-endless"])
        assert client.status().model == "fake"  # the stream's leftovers do not confuse the next call


def test_client_refuses_malformed_endpoints():
    with pytest.raises(ValueError, match="endpoint"):
        Client("http://localhost:80")


# ---- async client --------------------------------------------------------------------------


def test_async_concurrent_generates_each_get_their_own_chunks_in_order(endpoint):
    async def consume(client, number):
        return [reply async for reply in client.generate(Generate(id=f"req{number}", prompt=f"p{number}"))]

    async def main():
        async with AsyncClient(endpoint, timeout_s=2.0) as client:
            return await asyncio.gather(*(consume(client, number) for number in range(5)))

    with FakeDaemon(endpoint, batch=5) as daemon:
        results = asyncio.run(main())
    assert len(set(daemon.sent_ids[:5])) == 5  # the daemon really interleaved the five streams
    for number, replies in enumerate(results):
        assert [reply.text for reply in replies[:-1]] == [f"p{number}:{index}" for index in range(3)]
        assert isinstance(replies[-1], Done) and {reply.id for reply in replies} == {f"req{number}"}


def test_async_unary_calls_run_concurrently(endpoint):
    async def main():
        async with AsyncClient(endpoint, timeout_s=2.0) as client:
            return await asyncio.gather(
                client.status(), client.tokenize("ab"), client.detokenize([99]), client.hello(), client.ping(1.0)
            )

    with FakeDaemon(endpoint):
        status, tokens, text, hello, alive = asyncio.run(main())
    assert status.model == "fake" and hello.model == "fake"
    assert tokens == [97, 98] and text == "c" and alive is True


def test_async_break_sends_cancel(endpoint):
    async def main(daemon):
        async with AsyncClient(endpoint, timeout_s=2.0) as client:
            async for reply in client.generate(Generate(id="stop-me", prompt="endless")):
                assert reply.text == "endless:0"
                break
            assert await async_wait_until(lambda: "stop-me" in daemon.cancels)
            assert (await client.status()).model == "fake"

    with FakeDaemon(endpoint) as daemon:
        asyncio.run(main(daemon))


def test_async_cancelled_consumer_task_sends_cancel(endpoint):
    async def main(daemon):
        async with AsyncClient(endpoint, timeout_s=2.0) as client:
            first_chunk = asyncio.Event()

            async def consume():
                async for _ in client.generate(Generate(id="task-gen", prompt="hang")):
                    first_chunk.set()

            task = asyncio.create_task(consume())
            await asyncio.wait_for(first_chunk.wait(), 2.0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await async_wait_until(lambda: "task-gen" in daemon.cancels)

    with FakeDaemon(endpoint) as daemon:
        asyncio.run(main(daemon))


def test_async_errors_timeouts_and_close(endpoint):
    async def against_fake():
        async with AsyncClient(endpoint, timeout_s=2.0) as client:
            with pytest.raises(DaemonError) as caught:
                async for _ in client.generate(Generate(id="bad", prompt="boom")):
                    pass
            assert caught.value.code == INVALID

    async def against_silent():
        client = AsyncClient(endpoint, timeout_s=0.2)
        with pytest.raises(DaemonTimeout):
            await client.status()
        assert await client.ping(0.1) is False
        waiting = asyncio.create_task(client.status())
        await asyncio.sleep(0.02)
        await client.aclose()
        with pytest.raises(DaemonError) as caught:
            await waiting
        assert caught.value.code == CLIENT_CLOSED

    with FakeDaemon(endpoint):
        asyncio.run(against_fake())
    with FakeDaemon(endpoint, silent=True):
        asyncio.run(against_silent())


# ---- the connection drops ------------------------------------------------------------------


def test_blocking_stream_fails_at_once_when_the_daemon_goes_away(endpoint):
    with Client(endpoint, timeout_s=30.0) as client:
        with FakeDaemon(endpoint):
            stream = client.generate(Generate(id="h", prompt="hang"))
            assert isinstance(next(stream), Chunk)
        started = time.monotonic()  # the fake daemon's socket is closed: the connection dropped
        with pytest.raises(DaemonError) as caught:
            next(stream)
        assert caught.value.code == DISCONNECTED and time.monotonic() - started < 1.0
        with FakeDaemon(endpoint):  # back: ZeroMQ reconnects and the next request is answered
            assert client.status().model == "fake"


def test_async_stream_fails_at_once_when_the_daemon_goes_away(endpoint):
    async def main():
        async with AsyncClient(endpoint, timeout_s=30.0) as client:
            dropped = []
            client.on_disconnect(dropped.append)
            with FakeDaemon(endpoint):
                stream = client.generate(Generate(id="h", prompt="hang"))
                assert isinstance(await anext(stream), Chunk)
                assert client.connected and not client.connection_lost
            started = time.monotonic()
            with pytest.raises(DaemonError) as caught:
                await anext(stream)
            assert caught.value.code == DISCONNECTED and time.monotonic() - started < 1.0
            assert client.connection_lost and len(dropped) == 1 and endpoint in dropped[0]
            assert await client.wait_connected(0.2) is False
            with FakeDaemon(endpoint):
                assert await client.wait_connected(5.0)
                assert not client.connection_lost and (await client.status()).model == "fake"

    asyncio.run(main())
