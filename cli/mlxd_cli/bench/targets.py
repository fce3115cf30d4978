"""What mlx-bench measures: OpenAI-compatible HTTP servers, mlxd daemons, and servers it starts itself.

Contract:
    * ``parse_target`` turns ``--target NAME=URL`` into an ``HttpTarget`` (OpenAI-compatible base URL) and
      ``--target NAME=daemon:ENDPOINT`` into a ``DaemonTarget`` (``mlxd_protocol.AsyncClient``; ``daemon:``
      alone: the default endpoint). A ``ServedTarget`` (``--serve``) is an ``HttpTarget`` it starts and stops.
    * In one event loop: ``await open()`` (connect; model name: the one given, else the first id of
      ``GET /v1/models``, or the daemon's model; ``TargetUnavailable`` when nothing answers), then any
      number of concurrent ``await run_request(request)``, then ``await aclose()``.
    * ``run_request`` never raises (except for its task's cancellation): HTTP errors, error events, daemon
      errors, timeouts (``request.timeout_s`` for the whole request), anything else: ``ok=False``, ``error``.
    * Timing starts just before sending; ``token_times_s`` holds the arrival of every chunk carrying
      content (HTTP: ``delta.content`` / ``delta.reasoning_content`` / ``text``; daemon: a Chunk with
      tokens); TTFT is the first. HTTP streams with ``stream_options.include_usage``; completion tokens
      come from ``usage`` when sent, else they are the content chunks (``tokens_from`` says which).
      ``timings``: the extension object of the last chunk that had one (mlx-serve-http, llama-server) or
      mlxd's ``Done.timings``; None when absent. ``text``: the reply's content as streamed (HTTP:
      ``delta.content`` / ``text``, not reasoning; daemon: the Chunks' text), which a chat session sends
      back in its next turn.
    * Chat: ``request.messages`` (a chat session's history) is sent as it is, else one user message with
      ``request.prompt``. ``cache_prompt`` (a target's attribute, set by ``--no-cache-prompt``): None sends
      nothing; a bool goes in every request as ``cache_prompt`` (llama-server's and mlxd's field; HTTP
      body, or ``Generate.cache_prompt`` for a daemon, whose ``open()`` refuses ``cache_prompt=False``
      when the installed ``mlxd_protocol`` has no such field).
    * Served: ``{port}`` becomes a free loopback port; the command runs through the shell in its own
      process group, output to a log file; ready when ``GET {url}/v1/models`` answers 200 (polled up to
      the serve timeout); ``stop()``: SIGTERM to the group, SIGKILL after ``STOP_GRACE_S``, then the same to
      every process the command started outside the group (``leftovers.py``: an autostarted daemon).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from .leftovers import MARKER_ENV, new_marker, stop_marked
from .runner import BenchRequest, RequestSample

STOP_GRACE_S = 10.0
READY_POLL_S = 0.5
OPEN_TIMEOUT_S = 30.0  # longest wait for /v1/models or a daemon's Status when a target is opened
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


class TargetUnavailable(RuntimeError):
    """A target could not be reached or started."""


def _describe_error(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return f"timeout: {error}" if str(error) else "timeout"
    return f"{type(error).__name__}: {error}"


class _Target:
    """What every target shares: a name, a client opened by ``open()``, timed requests."""

    kind = "target"
    name: str
    model: str | None
    cache_prompt: bool | None = None  # sent with every request when not None (``--no-cache-prompt``)
    _client: Any = None

    async def aclose(self) -> None:
        """Close the client; safe to call twice."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def run_request(self, request: BenchRequest) -> RequestSample:
        """Send one streaming request and time it; never raises (see the module docstring).

        Args:
            request: The benchmark request.

        Returns:
            The sample (``ok=False`` with ``error`` set when it failed or timed out).
        """
        sample = RequestSample(target=self.name, index=request.index, turn=request.turn)
        started = time.perf_counter()
        try:
            if self._client is None:
                raise TargetUnavailable(f"{self.name}: not opened")
            async with asyncio.timeout(request.timeout_s):
                await self._stream(request, sample, started)
            sample.ok = sample.error is None
        except Exception as error:  # a failed request is a measurement, never a crash
            sample.error = _describe_error(error)
        sample.latency_s = time.perf_counter() - started
        return sample

    async def _stream(self, request: BenchRequest, sample: RequestSample, started: float) -> None:
        raise NotImplementedError


class HttpTarget(_Target):
    """An OpenAI-compatible server (``/v1/models``, streaming ``/v1/chat/completions`` and ``/v1/completions``).

    Args:
        name: The target's name in reports.
        url: Base URL, e.g. ``http://127.0.0.1:8080`` (a trailing ``/v1`` is accepted).
        api_key: Sent as ``Authorization: Bearer`` when given.
        model: The ``model`` field to send; None: the first id of ``/v1/models``.
    """

    kind = "http"

    def __init__(self, name: str, url: str, api_key: str | None = None, model: str | None = None) -> None:
        self.name = name
        self.url = re.sub(r"/v1/?$", "", url.rstrip("/"))
        self.api_key = api_key
        self.model = model
        self._client: httpx.AsyncClient | None = None

    def describe(self) -> dict[str, Any]:
        """Returns: what reports say about this target."""
        return {
            "name": self.name,
            "kind": self.kind,
            "url": self.url,
            "model": self.model,
            "cache_prompt": self.cache_prompt,
        }

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def open(self) -> None:
        """Connect and resolve the model name.

        Raises:
            TargetUnavailable: ``/v1/models`` failed while the model name was needed.
        """
        self._client = httpx.AsyncClient(  # environment proxies must not capture requests to this machine
            base_url=self.url,
            headers=self._headers(),
            trust_env=urlparse(self.url).hostname not in _LOOPBACK_HOSTS,
            timeout=httpx.Timeout(None, connect=30.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )
        if self.model is None:
            try:
                response = await self._client.get("/v1/models", timeout=OPEN_TIMEOUT_S)
                response.raise_for_status()
                self.model = response.json()["data"][0]["id"]
            except Exception as error:
                await self.aclose()
                raise TargetUnavailable(
                    f"{self.name}: GET {self.url}/v1/models failed: {_describe_error(error)} (give --model)"
                ) from error

    def request_body(self, request: BenchRequest) -> tuple[str, dict[str, Any]]:
        """The path and JSON body of a streaming request.

        Args:
            request: The benchmark request.

        Returns:
            ``("/v1/chat/completions" | "/v1/completions", body)``.
        """
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.seed is not None:
            body["seed"] = request.seed
        if request.ignore_eos:
            body["ignore_eos"] = True
        if self.cache_prompt is not None:
            body["cache_prompt"] = self.cache_prompt
        if request.chat or request.messages is not None:
            body["messages"] = request.messages or [{"role": "user", "content": request.prompt}]
            return "/v1/chat/completions", body
        body["prompt"] = request.prompt
        return "/v1/completions", body

    async def _stream(self, request: BenchRequest, sample: RequestSample, started: float) -> None:
        path, body = self.request_body(request)
        async with self._client.stream("POST", path, json=body) as response:  # type: ignore[union-attr]  # see open()
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace").strip()
                sample.error = f"HTTP {response.status_code}: {text[:200]}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                self._read_event(json.loads(payload), sample, time.perf_counter() - started)
        sample.count_tokens(len(sample.token_times_s))

    @staticmethod
    def _read_event(event: dict, sample: RequestSample, elapsed_s: float) -> None:
        if "error" in event:
            raise RuntimeError(f"error event in the stream: {json.dumps(event['error'])[:200]}")
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            content = (
                delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or choice.get("text")
            )
            if content:
                sample.content_arrived(elapsed_s)
            text = delta.get("content") or choice.get("text")
            if text:
                sample.text += text
            if choice.get("finish_reason"):
                sample.finish_reason = choice["finish_reason"]
        if isinstance(event.get("usage"), dict):
            sample.usage = event["usage"]
        if isinstance(event.get("timings"), dict):
            sample.timings = event["timings"]


class DaemonTarget(_Target):
    """An mlxd daemon reached through its own protocol (``mlxd_protocol.AsyncClient``).

    Args:
        name: The target's name in reports.
        endpoint: The daemon's endpoint; None or empty: the default endpoint.
    """

    kind = "daemon"

    def __init__(self, name: str, endpoint: str | None = None) -> None:
        self.name = name
        self.endpoint = endpoint or None
        self.model: str | None = None

    def describe(self) -> dict[str, Any]:
        """Returns: what reports say about this target."""
        return {
            "name": self.name,
            "kind": self.kind,
            "endpoint": self.endpoint,
            "model": self.model,
            "cache_prompt": self.cache_prompt,
        }

    async def open(self) -> None:
        """Connect and read the daemon's model.

        Raises:
            TargetUnavailable: No daemon answers.
        """
        from mlxd_protocol import AsyncClient

        if self.cache_prompt is not None and not _generate_has_cache_prompt():
            raise TargetUnavailable(
                f"{self.name}: this mlxd_protocol's Generate has no cache_prompt field, "
                "so --no-cache-prompt works only for HTTP targets"
            )
        self._client = AsyncClient(self.endpoint, timeout_s=600.0)
        self.endpoint = self._client.endpoint
        try:
            async with asyncio.timeout(OPEN_TIMEOUT_S):
                self.model = (await self._client.status()).model
        except Exception as error:
            await self.aclose()
            raise TargetUnavailable(
                f"{self.name}: no mlxd answers at {self.endpoint}: {_describe_error(error)}"
            ) from error

    async def _stream(self, request: BenchRequest, sample: RequestSample, started: float) -> None:
        from mlxd_protocol import Chunk, Generate, Sampling, new_request_id

        chat = request.chat or request.messages is not None
        extra: dict[str, Any] = {} if self.cache_prompt is None else {"cache_prompt": self.cache_prompt}
        generate = Generate(
            id=new_request_id(),
            max_tokens=request.max_tokens,
            stream=True,
            ignore_eos=request.ignore_eos,
            messages=(request.messages or [{"role": "user", "content": request.prompt}]) if chat else None,
            prompt=None if chat else request.prompt,
            chat=chat,
            sampling=Sampling(temperature=request.temperature, seed=request.seed),
            **extra,
        )
        counted = 0
        # aclosing: on a timeout the client's generator ends at once, so it sends Cancel to the daemon now.
        async with contextlib.aclosing(self._client.generate(generate)) as replies:
            async for reply in replies:
                if reply.tokens:
                    sample.content_arrived(time.perf_counter() - started)
                    counted += len(reply.tokens)
                if isinstance(reply, Chunk):
                    sample.text += reply.text
                if not isinstance(reply, Chunk):
                    sample.finish_reason, sample.usage = reply.finish_reason, dict(reply.usage)
                    sample.timings = dict(reply.timings) or None
        sample.count_tokens(counted)


def _generate_has_cache_prompt() -> bool:
    import dataclasses

    from mlxd_protocol import Generate

    return any(field.name == "cache_prompt" for field in dataclasses.fields(Generate))


def free_loopback_port() -> int:
    """Returns: a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _group_alive(process_group: int) -> bool:
    try:
        os.killpg(process_group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class ServedTarget(HttpTarget):
    """An OpenAI-compatible server started for the run (``--serve NAME='command ... {port} ...'``).

    Args:
        name: The target's name.
        command: Shell command line; ``{port}`` is replaced by a free loopback port.
        api_key: As for ``HttpTarget``.
        model: As for ``HttpTarget``.
    """

    kind = "served"

    def __init__(self, name: str, command: str, api_key: str | None = None, model: str | None = None) -> None:
        super().__init__(name, "http://127.0.0.1:0", api_key, model)
        self.command_template = command
        self.command: str | None = None
        self.log_path: Path | None = None
        self.process: subprocess.Popen | None = None
        self.marker: str | None = None  # in the command's environment: finds what it started (leftovers.py)

    def describe(self) -> dict[str, Any]:
        """Returns: what reports say about this target."""
        return {
            **super().describe(),
            "command": self.command or self.command_template,
            "log": str(self.log_path) if self.log_path else None,
        }

    def start(self, log_dir: Path, timeout_s: float = 300.0) -> None:
        """Start the server and wait until ``GET /v1/models`` answers 200.

        Args:
            log_dir: Where ``serve-<name>.log`` is written.
            timeout_s: Longest wait for readiness.

        Raises:
            TargetUnavailable: The process exited or did not get ready in time (it is stopped first).
        """
        port = free_loopback_port()
        self.url = f"http://127.0.0.1:{port}"
        self.command = self.command_template.replace("{port}", str(port))
        self.log_path = Path(log_dir) / f"serve-{re.sub(r'[^A-Za-z0-9_.-]+', '_', self.name)}.log"
        self.marker = new_marker()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command,
                shell=True,
                env={**os.environ, MARKER_ENV: self.marker},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        with httpx.Client(headers=self._headers(), trust_env=False, timeout=5.0) as client:
            while (code := self.process.poll()) is None and time.monotonic() < deadline:
                try:
                    if client.get(f"{self.url}/v1/models").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(READY_POLL_S)
        self.stop()
        problem = f"the server exited with status {code}" if code is not None else f"not ready within {timeout_s:g} s"
        raise TargetUnavailable(f"{self.name}: {problem}; log {self.log_path}:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``STOP_GRACE_S``, then the same to what it
        started outside the group; safe to call twice."""
        process, self.process = self.process, None
        if process is None:
            return
        try:
            self._stop_group(process)
        finally:
            if self.marker is not None:
                stop_marked(self.marker, STOP_GRACE_S)

    @staticmethod
    def _stop_group(process: subprocess.Popen) -> None:
        for sig, grace_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                process.poll()  # reap the leader, or the group never looks empty
                if not _group_alive(process.pid):
                    return
                time.sleep(0.05)
        process.poll()

    def log_tail(self, lines: int = 20) -> str:
        """Returns: the last lines of the server's log."""
        try:
            text = self.log_path.read_text(errors="replace")  # type: ignore[union-attr]  # None: AttributeError
            return "\n".join(text.splitlines()[-lines:])
        except (OSError, AttributeError):
            return "(no log)"


def parse_target(name: str, spec: str, api_key: str | None = None, model: str | None = None):
    """Build a target from ``--target NAME=SPEC``.

    Args:
        name: The target's name.
        spec: ``http(s)://...`` or ``daemon:ENDPOINT``.
        api_key: For HTTP targets.
        model: The ``model`` field for HTTP targets.

    Returns:
        An ``HttpTarget`` or a ``DaemonTarget``; ValueError when the spec is neither form.
    """
    if spec.startswith("daemon:"):
        return DaemonTarget(name, spec[len("daemon:") :])
    if spec.startswith(("http://", "https://")):
        return HttpTarget(name, spec, api_key, model)
    raise ValueError(f"target {name!r}: expected http://HOST:PORT or daemon:ENDPOINT, got {spec!r}")
