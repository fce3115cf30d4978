"""mlxd scheduler: runs requests on the engine with continuous batching and lookahead pipelining.

- ``BatchScheduler`` (no sockets, no threads): admission, chunked prefill, decode ticks, finishing,
  cancellation, timings and the tick trace.
- ``InProcessClient``: the real scheduler driven from the caller's own thread (it starts none), for
  tests and library use; the daemon's wire-level twin is ``mlxd_protocol.LocalClient``.
- ``single_sequence``: one-request loops, the reference the batched scheduler is checked against.
"""

from .inprocess import InProcessClient
from .request import Event, FinishEvent, Request, SpeculativeRequest, TokenEvent
from .scheduler import BatchScheduler, QueueFull, SchedulerOptions
from .single_sequence import GenerationResult, generate_plain, generate_with_prompt_lookup
from .text_stream import TextStream
from .trace import TickRecord

__all__ = [
    "BatchScheduler",
    "Event",
    "FinishEvent",
    "GenerationResult",
    "InProcessClient",
    "QueueFull",
    "Request",
    "SchedulerOptions",
    "SpeculativeRequest",
    "TextStream",
    "TickRecord",
    "TokenEvent",
    "generate_plain",
    "generate_with_prompt_lookup",
]
