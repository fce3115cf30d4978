"""Several choices of one request (OpenAI's ``n``): one generation per choice, opened together, read as one.

Contract: ``open_choices(pool, builders)`` opens one generation per ``make_request`` at once (each may land
on another daemon) and returns them as a ``ChoiceStreams``; if any cannot be opened, the others are closed
and that failure is raised (an ``ApiError``, as ``open_generation`` raises it). ``ChoiceStreams`` iterates
over ``(index, reply)`` pairs in the order the replies arrive, each choice's in its own order, until every
choice has its Done; ``aclose()`` closes every generation still running (it cancels them on the daemons),
so it fits where one ``GenerationStream`` does (``streaming.sse_body``). ``handle`` is the first choice's
daemon (the reply's ``model`` and ``system_fingerprint``). ``collect_choices`` reads them all for a
non-streaming answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.requests import Request

from mlxd_protocol import Chunk, Done, Generate

from .daemon_pool import DaemonHandle, DaemonPool, GenerationStream, open_generation
from .streaming import CollectedGeneration, collect_generation

RequestBuilder = Callable[[DaemonHandle], Generate]


class ChoiceStreams:
    """The generations of a request's choices, read as one stream of ``(index, reply)``."""

    def __init__(self, streams: list[GenerationStream]):
        self.streams = streams
        self._next: dict[int, asyncio.Task] = {}
        self._finished: set[int] = set()

    @property
    def handle(self) -> DaemonHandle:
        return self.streams[0].handle

    def __aiter__(self) -> ChoiceStreams:
        return self

    async def __anext__(self) -> tuple[int, Chunk | Done]:
        for index, stream in enumerate(self.streams):
            if index not in self._finished and index not in self._next:
                self._next[index] = asyncio.ensure_future(anext(stream))
        if not self._next:
            raise StopAsyncIteration
        done, _ = await asyncio.wait(self._next.values(), return_when=asyncio.FIRST_COMPLETED)
        # several may be ready: take the lowest index, the others stay for the next call
        index = min(index for index, task in self._next.items() if task in done)
        task = self._next.pop(index)
        try:
            reply = task.result()
        except StopAsyncIteration:
            self._finished.add(index)
            return await self.__anext__()
        if isinstance(reply, Done):
            self._finished.add(index)
        return index, reply

    async def aclose(self) -> None:
        """Close every choice's generation (those still running are cancelled on their daemons)."""
        pending = list(self._next.values())
        self._next.clear()
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for stream in self.streams:
            await stream.aclose()


async def open_choices(pool: DaemonPool, builders: list[RequestBuilder]) -> ChoiceStreams:
    """Open one generation per builder at once; see the module docstring.

    Raises:
        ApiError: a choice could not be opened (the others are closed first).
    """
    opened = await asyncio.gather(*(open_generation(pool, build) for build in builders), return_exceptions=True)
    failure = next((result for result in opened if isinstance(result, BaseException)), None)
    if failure is not None:
        for result in opened:
            if isinstance(result, GenerationStream):
                await result.aclose()
        raise failure
    return ChoiceStreams(list(opened))  # type: ignore[arg-type]  # no failure: every one is a stream


async def collect_choices(choices: ChoiceStreams, request: Request) -> list[CollectedGeneration] | None:
    """Read every choice to its Done at once (``streaming.collect_generation`` each); None when the client
    left. A failure of one choice closes the others and is raised (an ``ApiError``)."""
    tasks = [asyncio.ensure_future(collect_generation(stream, request)) for stream in choices.streams]
    try:
        results = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await choices.aclose()
    return None if any(result is None for result in results) else list(results)  # type: ignore[arg-type]
