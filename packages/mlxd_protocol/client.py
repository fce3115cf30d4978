"""Blocking client for the mlxd daemon over a ZeroMQ DEALER socket.

Contract:
    * One request at a time per ``Client``, from one thread (a ZeroMQ socket belongs to the
      thread that uses it); use ``AsyncClient`` for many requests in flight.
    * Every request carries an id (``new_request_id()`` unless the caller set one) and only
      replies with that id are accepted: replies for other ids, such as the late answer to a
      request that timed out or the tail of an abandoned stream, are dropped.
    * An ``Error`` reply raises ``DaemonError(code, message)``; silence for ``timeout_s`` (per
      reply, so a long generation is fine as long as chunks keep coming) raises ``DaemonTimeout``.
    * ``generate`` sends at once and returns an iterator of ``Chunk``s then the ``Done``; if the
      caller stops iterating before the ``Done`` (or the wait times out) it sends ``Cancel``.
    * The connection is watched with ZeroMQ's socket monitor: if it drops while a reply is awaited
      (the daemon exited or was killed), the replies that arrived before the drop are still read,
      then ``DaemonError("disconnected")`` is raised at once instead of waiting for ``timeout_s``.
    * ``subscribe_ticks()`` subscribes to the daemon's tick trace (its trace endpoint, a SUB socket of
      its own) and yields typed, versioned ``Tick`` messages, decoded like every other frame.
"""

import time
from collections.abc import Iterator

import zmq
from zmq.utils.monitor import parse_monitor_message

from .client_common import (  # noqa: F401  (DaemonError, DaemonTimeout, new_request_id re-exported)
    CLOSE_LINGER_MS,
    CONNECTION_EVENTS,
    DaemonError,
    DaemonTimeout,
    ReplyT,
    connect_dealer,
    connect_trace,
    needs_hello,
    new_request_id,
    read_tick,
    resolve_auth_token,
    something_listens,
    tokenize_request,
    unwrap_reply,
)
from .codec import ProtocolError, decode, encode
from .endpoints import default_endpoint, trace_endpoint
from .messages import (
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
    Tick,
    TokenizeResult,
)


class Client:
    """Blocking client; see the module docstring for its rules.

    Args:
        endpoint: The daemon's endpoint; ``default_endpoint()`` when None.
        timeout_s: Longest wait for any one reply.
        context: ZeroMQ context; the process-wide one when None.
        auth_token: The daemon's auth token (``$MLXD_AUTH_TOKEN`` when None): sent in a Hello
            before the first request, and again after an "unauthorized" reply (a reconnection).
    """

    def __init__(
        self,
        endpoint: str | None = None,
        timeout_s: float = 30.0,
        context: zmq.Context | None = None,
        auth_token: str | None = None,
    ) -> None:
        self.endpoint = endpoint or default_endpoint()
        self.timeout_s = timeout_s
        self.auth_token = resolve_auth_token(auth_token)
        self._authenticated = False
        self._context = context or zmq.Context.instance()
        self._socket = connect_dealer(self._context, self.endpoint)
        self._monitor = self._socket.get_monitor_socket(CONNECTION_EVENTS)
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self.connected = False  # a connection to the daemon is up (as far as the monitor has told)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the socket; safe to call twice."""
        if not self._socket.closed:
            self._socket.disable_monitor()
            self._monitor.close(linger=0)
            self._socket.close(linger=CLOSE_LINGER_MS)

    def _connection_dropped(self) -> bool:
        """Read the monitor's waiting events; True when the connection dropped among them."""
        dropped = False
        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))["event"]
            except zmq.Again:
                return dropped
            if event == zmq.EVENT_CONNECTED:
                self.connected = True
            elif event == zmq.EVENT_DISCONNECTED:
                self.connected, dropped = False, True
                self._authenticated = False  # a new connection (to a restarted daemon) says hello again

    def _send(self, message: Message) -> None:
        self._connection_dropped()  # a drop before this request does not concern it
        hello = needs_hello(self, message)
        if hello is not None:
            self._send(hello)  # its Status reply carries another id and is dropped
        try:
            # With connect(), ZeroMQ queues frames even before the daemon is up; Again means
            # the queue is full, which only a daemon that stopped reading causes.
            self._socket.send(encode(message), flags=zmq.NOBLOCK)
        except zmq.Again:
            raise DaemonTimeout(f"the daemon at {self.endpoint} is not taking requests") from None

    def _receive(self, request_id: str | None, timeout_s: float) -> Message:
        """Wait for the next reply carrying ``request_id``; drop the others."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_ms = (deadline - time.monotonic()) * 1000
            ready = dict(self._poller.poll(max(1, int(remaining_ms)))) if remaining_ms > 0 else {}
            if not ready:
                raise DaemonTimeout(f"no reply from the daemon at {self.endpoint} within {timeout_s:g} s")
            if self._monitor in ready and self._connection_dropped():
                while (frame := self._next_frame()) is not None:  # what came before the drop
                    reply = self._ours(frame, request_id)
                    if reply is not None:
                        return reply
                raise DaemonError(
                    DISCONNECTED, f"the connection to the daemon at {self.endpoint} dropped (it exited or was killed)"
                )
            if self._socket in ready and (frame := self._next_frame()) is not None:
                reply = self._ours(frame, request_id)
                if reply is not None:
                    return reply

    def _next_frame(self) -> bytes | None:
        try:
            return self._socket.recv(zmq.NOBLOCK)
        except zmq.Again:
            return None

    @staticmethod
    def _ours(frame: bytes, request_id: str | None) -> Message | None:
        """The reply in ``frame`` if it answers ``request_id``, else None (a stale reply is dropped)."""
        try:
            reply = decode(frame)
        except ProtocolError as error:
            if error.request_id not in (None, request_id):
                return None
            raise DaemonError(error.code, f"unreadable reply from the daemon: {error.message}") from None
        # An Error without id answers a frame the daemon could not read: with one request at a
        # time, that frame was ours.
        if reply.id == request_id or (isinstance(reply, Error) and reply.id is None):
            return reply
        return None

    def _call(self, request: Message, expected: type[ReplyT]) -> ReplyT:
        self._send(request)
        reply = self._receive(request.id, self.timeout_s)
        if isinstance(reply, Error) and reply.code == UNAUTHORIZED and self._authenticated:
            self._authenticated = False  # the daemon restarted or we reconnected: say hello again
            self._send(request)
            reply = self._receive(request.id, self.timeout_s)
        return unwrap_reply(reply, expected)

    def hello(self, client: str = "mlxd_protocol.Client") -> Status:
        """Introduce this client to the daemon.

        Args:
            client: A name for the daemon's log.

        Returns:
            The daemon's Status.
        """
        return self._call(Hello(client=client, id=new_request_id(), token=self.auth_token), Status)

    def status(self) -> Status:
        """Ask for the daemon's Status.

        Returns:
            The Status reply.
        """
        return self._call(StatusRequest(id=new_request_id()), Status)

    def ping(self, timeout_s: float = 1.0) -> bool:
        """Check that a daemon answers; never raises.

        Args:
            timeout_s: How long to wait for the Status.

        Returns:
            True when a Status arrived in time.
        """
        if not something_listens(self.endpoint):
            return False  # at once: nothing is there to answer
        request = StatusRequest(id=new_request_id())
        try:
            self._send(request)
            return isinstance(self._receive(request.id, timeout_s), Status)
        except Exception:  # a probe reports, it does not fail: any problem means "not answering"
            return False

    def tokenize(
        self,
        text: str | None = None,
        messages: list[dict] | None = None,
        add_special_tokens: bool = True,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
        continue_final_message: bool = False,
    ) -> list[int]:
        """Tokenize text, or chat messages through the model's chat template.

        Args:
            text: Plain text (exactly one of text / messages).
            messages: Chat messages, each ``{"role": ..., "content": ...}``.
            add_special_tokens: Let the tokenizer add BOS and the like.
            tools: Tool definitions the chat template renders with ``messages`` (as a Generate's).
            chat_template_kwargs: Extra template variables (e.g. ``{"enable_thinking": False}``).
            continue_final_message: Continue the last (assistant) message, as a Generate's assistant prefill.

        Returns:
            The token ids (for messages: a Generate of the same fields is prompted with exactly these).
        """
        request = tokenize_request(
            text,
            messages,
            add_special_tokens,
            tools,
            chat_template_kwargs=chat_template_kwargs,
            continue_final_message=continue_final_message,
        )
        return self._call(request, TokenizeResult).tokens

    def render_chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict | None = None,
        continue_final_message: bool = False,
    ) -> str:
        """The prompt text of chat ``messages`` through the model's chat template (what a Generate of them
        would be given; llama-server's /apply-template). Arguments as ``tokenize``'s; ``add_generation_prompt``
        false ends the rendering without the assistant's header."""
        request = tokenize_request(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs,
            continue_final_message=continue_final_message,
            return_text=True,
        )
        return self._call(request, TokenizeResult).text  # type: ignore[return-value]  # set: return_text

    def detokenize(self, tokens: list[int]) -> str:
        """Turn token ids back into text.

        Args:
            tokens: Token ids.

        Returns:
            The decoded text.
        """
        return self._call(Detokenize(tokens=list(tokens), id=new_request_id()), DetokenizeResult).text

    def embed(
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
        return self._call(request, EmbedResult)

    def shutdown(self) -> None:
        """Ask the daemon to stop; returns once it acknowledged."""
        self._call(Shutdown(id=new_request_id()), Ok)

    def cancel(self, request_id: str) -> None:
        """Ask the daemon to stop a generation; no reply (its stream ends with a cancelled Done).

        Args:
            request_id: The id of the Generate to stop.
        """
        self._send(Cancel(id=request_id))

    def _cancel_quietly(self, request_id: str) -> None:
        try:
            self.cancel(request_id)
        except (zmq.ZMQError, DaemonTimeout):
            pass  # best effort: the daemon also gives up on a stream when max_tokens is reached

    def subscribe_ticks(self, idle_timeout_s: float | None = None) -> "TickSubscription":
        """Watch the daemon's scheduler ticks as they happen.

        The subscription starts now (the daemon publishes only while someone subscribes, and a new
        subscription takes a moment to reach it: ticks before that are not seen).

        Args:
            idle_timeout_s: Raise ``DaemonTimeout`` when no tick comes for this long (None: wait on).

        Returns:
            An iterator of ``Tick`` messages; close it (or use it in a ``with``) to unsubscribe.
        """
        return TickSubscription(self._context, trace_endpoint(self.endpoint), idle_timeout_s, self.auth_token)

    def generate(self, request: Generate) -> Iterator[Chunk | Progress | Done]:
        """Send a Generate and iterate over its replies.

        Args:
            request: The generation request (its id is what replies are matched on).

        Returns:
            An iterator yielding each Chunk, then the Done (with ``stream=False``, only the Done).

        Raises:
            ProtocolError: The request is invalid (raised here, before anything is sent).
            DaemonError: While iterating, when the daemon answers with an Error.
            DaemonTimeout: While iterating, when no reply comes within ``timeout_s``.
        """
        self._send(request)
        return self._stream(request.id)

    def _stream(self, request_id: str) -> Iterator[Chunk | Progress | Done]:
        finished = False
        try:
            while True:
                reply = self._receive(request_id, self.timeout_s)
                if isinstance(reply, (Chunk, Progress)):
                    yield reply
                    continue
                finished = True  # a Done or an Error both end the request on the daemon's side
                yield unwrap_reply(reply, Done)
                return
        finally:
            if not finished:
                self._cancel_quietly(request_id)


class TickSubscription:
    """The daemon's tick trace, as ``Tick`` messages (see ``Client.subscribe_ticks``).

    Args:
        context: The ZeroMQ context.
        endpoint: The daemon's trace endpoint.
        idle_timeout_s: Longest wait for one tick (None: no limit).
        auth_token: The daemon's auth token, when it has one: the trace socket then takes only
            subscribers that log in with it (ZeroMQ PLAIN, user ``endpoints.TRACE_USER``).
    """

    POLL_MS = 200  # waits are cut in slices, so ^C is seen promptly

    def __init__(
        self, context: zmq.Context, endpoint: str, idle_timeout_s: float | None = None, auth_token: str | None = None
    ) -> None:
        self.endpoint = endpoint
        self.idle_timeout_s = idle_timeout_s
        self._socket = connect_trace(context, endpoint, auth_token)

    def __iter__(self) -> "TickSubscription":
        return self

    def __next__(self) -> Tick:
        """The next tick.

        Raises:
            DaemonTimeout: No tick within ``idle_timeout_s``.
            DaemonError: A trace frame the protocol refuses (e.g. a daemon speaking another version).
        """
        deadline = None if self.idle_timeout_s is None else time.monotonic() + self.idle_timeout_s
        while True:
            wait_ms = self.POLL_MS
            if deadline is not None:
                wait_ms = min(wait_ms, int((deadline - time.monotonic()) * 1000))
                if wait_ms <= 0:
                    raise DaemonTimeout(f"no tick from {self.endpoint} within {self.idle_timeout_s:g} s")
            if not self._socket.poll(max(1, wait_ms)):
                continue
            tick = read_tick(self._socket.recv_multipart())
            if tick is not None:
                return tick

    def close(self) -> None:
        """Unsubscribe; safe to call twice."""
        if not self._socket.closed:
            self._socket.close()

    def __enter__(self) -> "TickSubscription":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
