"""asyncio client for the mlxd daemon: many requests in flight on one DEALER socket.

Contract:
    * Any number of coroutines may use one ``AsyncClient`` at once (within one event loop).
      Every request carries an id; the loop's reader callback reads every reply and hands it to
      the queue registered for that id, so each caller sees exactly its own replies, in order.
      Replies for ids nobody waits for any more are dropped.
    * Errors as in the blocking client: an ``Error`` reply raises ``DaemonError``, no reply
      within ``timeout_s`` (per reply) raises ``DaemonTimeout``.
    * ``generate`` is an async generator of ``Chunk``s then the ``Done``; the request is sent on
      the first iteration. If the consumer stops before the ``Done`` (``break``, an exception, its
      task cancelled) or the wait times out, the client sends ``Cancel`` for that id by itself.
    * The connection is watched with ZeroMQ's socket monitor: when it drops (the daemon exited or
      was killed), every reply that arrived before the drop is still delivered, then every waiter
      gets ``DaemonError("disconnected")`` at once (no reply sent before the drop can come any more)
      and the ``on_disconnect`` callbacks run. ZeroMQ reconnects by itself; ``connection_lost`` is
      True from the drop until the connection is back, and ``wait_connected`` waits for it.
    * ``aclose()`` stops the reader, wakes every waiter with ``DaemonError("client_closed")``
      and closes the socket.
    * ``subscribe_ticks()`` watches the daemon's tick trace as the blocking client's does (the same
      socket and frames: ``client_common.connect_trace``, ``read_tick``), awaited instead of blocking
      (``async_ticks.AsyncTickSubscription``).
"""

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from .async_ticks import AsyncTickSubscription
from .client_common import (
    CLOSE_LINGER_MS,
    DaemonError,
    DaemonTimeout,
    ReplyT,
    connect_dealer,
    needs_hello,
    new_request_id,
    resolve_auth_token,
    tokenize_request,
    unwrap_reply,
)
from .codec import ProtocolError, decode, encode
from .endpoints import default_endpoint, trace_endpoint
from .loop_socket import LoopSocket
from .messages import (
    CLIENT_CLOSED,
    DISCONNECTED,
    UNAUTHORIZED,
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
    Shutdown,
    Status,
    StatusRequest,
    TokenizeResult,
)

# What the socket monitor reports: a connection made (again), a connection dropped.
CONNECTION_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED

log = logging.getLogger(__name__)


class AsyncClient:
    """asyncio client; see the module docstring for its rules.

    Args:
        endpoint: The daemon's endpoint; ``default_endpoint()`` when None.
        timeout_s: Longest wait for any one reply.
        context: A ``zmq.asyncio.Context``; the process-wide one when None.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        timeout_s: float = 30.0,
        context: zmq.asyncio.Context | None = None,
        auth_token: str | None = None,
    ) -> None:
        self.endpoint = endpoint or default_endpoint()
        self.timeout_s = timeout_s
        self.auth_token = resolve_auth_token(auth_token)  # as in Client
        self._authenticated = False
        self._context = context or zmq.asyncio.Context.instance()
        # Plain sockets on the same context, read from the loop's own callbacks (loop_socket.py)
        self._socket: zmq.Socket = connect_dealer(zmq.Context.shadow(self._context.underlying), self.endpoint)
        self._waiters: dict[str, asyncio.Queue] = {}
        self._failure: DaemonError | None = None
        # Cancel sends started from synchronous cleanup; kept so they are not garbage-collected.
        self._pending_sends: set[asyncio.Future] = set()
        self._replies = LoopSocket(self._socket, self._dispatch, self._socket_failed)
        # Made now, read once the client starts: events from before the first request wait in its queue.
        self._monitor = self._socket.get_monitor_socket(CONNECTION_EVENTS)
        self._events = LoopSocket(self._monitor, self._connection_event_frames, self._socket_failed, multipart=True)
        self.connected = False  # a connection to the daemon is up
        self.connection_lost = False  # it dropped and is not back yet
        self.disconnects = 0
        self._connection_changed: asyncio.Event | None = None
        self._disconnect_callbacks: list[Callable[[str], None]] = []

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the reader, fail every waiting request, close the socket; safe to call twice."""
        if self._socket.closed:
            return
        self._failure = DaemonError(CLIENT_CLOSED, "the client was closed")
        self._replies.stop()
        self._events.stop()
        self._fail_waiters(self._failure)
        self._socket.disable_monitor()
        self._monitor.close(linger=0)
        self._socket.close(linger=CLOSE_LINGER_MS)

    def subscribe_ticks(self) -> AsyncTickSubscription:
        """Watch the daemon's scheduler ticks as they happen (see ``Client.subscribe_ticks``).

        Returns:
            The subscription: ``await receive(timeout_s)`` for each tick; ``close()`` it to unsubscribe.
        """
        return AsyncTickSubscription(self._context, trace_endpoint(self.endpoint), self.auth_token)

    # ---- the connection --------------------------------------------------------------------

    def start(self) -> None:
        """Start reading replies and connection events now (the first request does it otherwise).

        Must be called inside the event loop that will use the client.
        """
        self._start_reader()

    def on_disconnect(self, callback: Callable[[str], None]) -> None:
        """Have ``callback(reason)`` called each time the connection drops (after waiters are failed)."""
        self._disconnect_callbacks.append(callback)

    async def wait_connected(self, timeout_s: float) -> bool:
        """Wait until a connection to the daemon is up.

        Args:
            timeout_s: Longest wait.

        Returns:
            True when connected (at once if it already is), False after ``timeout_s``.
        """
        self._start_reader()
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self.connected:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            changed = self._connection_event()
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                return self.connected
        return True

    def _connection_event(self) -> asyncio.Event:
        if self._connection_changed is None or self._connection_changed.is_set():
            self._connection_changed = asyncio.Event()
        return self._connection_changed

    def _connection_state(self, event: int) -> None:
        if event == zmq.EVENT_CONNECTED:
            self.connected, self.connection_lost = True, False
        elif event == zmq.EVENT_DISCONNECTED:
            self._connection_dropped()
        if self._connection_changed is not None:
            self._connection_changed.set()

    def _connection_dropped(self) -> None:
        self.connected, self.connection_lost = False, True
        self.disconnects += 1
        self._authenticated = False  # a new connection (to a restarted daemon) says hello again
        self._replies.drain()  # replies that arrived before the drop still go to their callers
        reason = f"the connection to the daemon at {self.endpoint} dropped (it exited or was killed)"
        self._fail_waiters(DaemonError(DISCONNECTED, reason))
        log.warning("%s; %d requests failed", reason, len(self._waiters))
        for callback in self._disconnect_callbacks:
            callback(reason)

    # ---- reading ---------------------------------------------------------------------------

    def _start_reader(self) -> None:
        if self._failure is not None:
            raise DaemonError(self._failure.code, self._failure.message)
        # A drop is handled only after every reply that came before it: _connection_dropped reads the
        # replies waiting before it fails the waiters.
        self._events.start()
        self._replies.start()

    def _connection_event_frames(self, parts: list[bytes]) -> None:
        self._connection_state(parse_monitor_message(parts)["event"])

    def _socket_failed(self, error: zmq.ZMQError) -> None:
        if self._failure is None:
            self._failure = DaemonError(CLIENT_CLOSED, f"the socket failed: {error}")
        self._fail_waiters(self._failure)

    def _dispatch(self, frame: bytes) -> None:
        reply: Message | DaemonError
        try:
            reply = decode(frame)
            request_id = reply.id
        except ProtocolError as error:
            reply = DaemonError(error.code, f"unreadable reply from the daemon: {error.message}")
            request_id = error.request_id
        waiter = self._waiters.get(request_id) if request_id is not None else None
        if waiter is None:
            # Either the request is over (stale reply) or the reply has no id (the daemon could not
            # read some frame): with many requests in flight, nobody can claim it; timeouts bound
            # the wait of whoever it was for.
            log.debug("dropping a reply for id %r: nobody waits for it", request_id)
            return
        waiter.put_nowait(reply)

    def _fail_waiters(self, failure: DaemonError) -> None:
        for waiter in self._waiters.values():
            waiter.put_nowait(DaemonError(failure.code, failure.message))

    def _register(self, request_id: str) -> asyncio.Queue:
        if request_id in self._waiters:
            raise ValueError(f"request id {request_id!r} is already in flight on this client")
        waiter: asyncio.Queue = asyncio.Queue()
        self._waiters[request_id] = waiter
        return waiter

    async def _next_reply(self, waiter: asyncio.Queue, timeout_s: float) -> Message:
        try:
            async with asyncio.timeout(timeout_s):
                item = await waiter.get()
        except TimeoutError:
            raise DaemonTimeout(f"no reply from the daemon at {self.endpoint} within {timeout_s:g} s") from None
        if isinstance(item, DaemonError):
            raise item
        return item

    async def _next_reply_or_error(self, waiter: asyncio.Queue, timeout_s: float) -> Message | DaemonError:
        try:
            reply = await self._next_reply(waiter, timeout_s)
        except DaemonError as error:
            return error
        if isinstance(reply, Error):
            return DaemonError(reply.code, reply.message)
        return reply

    # ---- requests --------------------------------------------------------------------------

    async def _send(self, message: Message) -> None:
        hello = needs_hello(self, message)
        if hello is not None:
            await self._replies.send(encode(hello))  # its Status reply carries another id and is dropped
        await self._replies.send(encode(message))

    async def _call(self, request: Message, expected: type[ReplyT], timeout_s: float | None = None) -> ReplyT:
        self._start_reader()
        request_id = request.id
        assert request_id is not None  # every request sent here carries new_request_id()
        waiter = self._register(request_id)
        try:
            await self._send(request)
            reply = await self._next_reply_or_error(waiter, self.timeout_s if timeout_s is None else timeout_s)
            if isinstance(reply, DaemonError) and reply.code == UNAUTHORIZED and self._authenticated:
                self._authenticated = False  # the daemon restarted or we reconnected: say hello again
                await self._send(request)
                reply = await self._next_reply_or_error(waiter, self.timeout_s if timeout_s is None else timeout_s)
            if isinstance(reply, DaemonError):
                raise reply
            return unwrap_reply(reply, expected)
        finally:
            del self._waiters[request_id]

    async def hello(self, client: str = "mlxd_protocol.AsyncClient") -> Status:
        """Introduce this client to the daemon.

        Args:
            client: A name for the daemon's log.

        Returns:
            The daemon's Status.
        """
        return await self._call(Hello(client=client, id=new_request_id(), token=self.auth_token), Status)

    async def status(self) -> Status:
        """Ask for the daemon's Status.

        Returns:
            The Status reply.
        """
        return await self._call(StatusRequest(id=new_request_id()), Status)

    async def ping(self, timeout_s: float = 1.0) -> bool:
        """Check that a daemon answers; never raises (except for its own task's cancellation).

        Args:
            timeout_s: How long to wait for the Status.

        Returns:
            True when a Status arrived in time.
        """
        try:
            await self._call(StatusRequest(id=new_request_id()), Status, timeout_s)
            return True
        except Exception:  # a probe reports, it does not fail: any problem means "not answering"
            return False

    async def tokenize(
        self,
        text: str | None = None,
        messages: list[dict] | None = None,
        add_special_tokens: bool = True,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
        continue_final_message: bool = False,
    ) -> list[int]:
        """Tokenize text, or chat messages through the model's chat template (as ``Client.tokenize``)."""
        request = tokenize_request(
            text,
            messages,
            add_special_tokens,
            tools,
            chat_template_kwargs=chat_template_kwargs,
            continue_final_message=continue_final_message,
        )
        return (await self._call(request, TokenizeResult)).tokens

    async def render_chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict | None = None,
        continue_final_message: bool = False,
    ) -> str:
        """The prompt text of chat messages through the chat template (as ``Client.render_chat``)."""
        request = tokenize_request(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs,
            continue_final_message=continue_final_message,
            return_text=True,
        )
        return (await self._call(request, TokenizeResult)).text  # type: ignore[return-value]  # set: return_text

    async def detokenize(self, tokens: list[int]) -> str:
        """Turn token ids back into text.

        Args:
            tokens: Token ids.

        Returns:
            The decoded text.
        """
        return (await self._call(Detokenize(tokens=list(tokens), id=new_request_id()), DetokenizeResult)).text

    async def embed(
        self,
        texts: list[str] | None = None,
        token_inputs: list[list[int]] | None = None,
        pooling: str | None = None,
        normalize: bool = True,
    ) -> EmbedResult:
        """Embeddings of texts or token lists (exactly one), from the model's last hidden state.

        Args:
            texts: Strings, each tokenized by the daemon.
            token_inputs: Token id lists, used as they are.
            pooling: "mean", "last", "cls" or "none" (a vector per token); None: the daemon's ``--pooling``.
            normalize: Scale every vector to unit L2 norm.

        Returns:
            The EmbedResult (vectors, each input's token count, the pooling applied).
        """
        request = Embed(
            texts=texts, token_inputs=token_inputs, pooling=pooling, normalize=normalize, id=new_request_id()
        )
        return await self._call(request, EmbedResult)

    async def shutdown(self) -> None:
        """Ask the daemon to stop; returns once it acknowledged."""
        await self._call(Shutdown(id=new_request_id()), Ok)

    async def cancel(self, request_id: str) -> None:
        """Ask the daemon to stop a generation; no reply (its stream ends with a cancelled Done).

        Args:
            request_id: The id of the Generate to stop.
        """
        await self._send(Cancel(id=request_id))

    def _cancel_soon(self, request_id: str) -> None:
        """Send a Cancel without awaiting: generator cleanup may run where awaiting is unsafe."""
        if self._socket.closed:
            return
        frame = encode(Cancel(id=request_id))
        try:
            if self._replies.try_send(frame):
                return
            sending = asyncio.get_running_loop().create_task(self._replies.send(frame))
        except (zmq.ZMQError, RuntimeError):  # closed, or no loop runs this cleanup
            return  # best effort: the daemon still stops at max_tokens
        self._pending_sends.add(sending)
        # Reading the outcome keeps asyncio from warning about an exception nobody retrieved.
        sending.add_done_callback(
            lambda done: (
                self._pending_sends.discard(done),  # type: ignore[func-returns-value]
                done.cancelled() or done.exception(),
            )
        )

    async def generate(self, request: Generate) -> AsyncGenerator[Chunk | Progress | Done, None]:
        """Send a Generate and iterate over its replies.

        Args:
            request: The generation request (its id is what replies are matched on).

        Yields:
            Each Chunk (and Progress, with ``return_progress``), then the Done (with ``stream=False``, only
            the Done).

        Raises:
            ProtocolError: The request is invalid (nothing is sent).
            DaemonError: The daemon answered with an Error.
            DaemonTimeout: No reply came within ``timeout_s``.
        """
        self._start_reader()
        waiter = self._register(request.id)
        in_flight = False
        try:
            await self._send(request)
            in_flight = True
            while True:
                reply = await self._next_reply(waiter, self.timeout_s)
                if isinstance(reply, (Chunk, Progress)):
                    yield reply
                    continue
                in_flight = False  # a Done or an Error both end the request on the daemon's side
                yield unwrap_reply(reply, Done)
                return
        finally:
            del self._waiters[request.id]
            if in_flight:
                self._cancel_soon(request.id)
