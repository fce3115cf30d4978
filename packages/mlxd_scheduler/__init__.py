"""mlxd scheduler: runs requests on the engine with continuous batching and lookahead pipelining.

- ``BatchScheduler`` (no sockets, no threads): admission, chunked prefill, decode ticks, finishing,
  cancellation, timings and the tick trace.
- ``InProcessClient``: the same scheduler on a thread, for tests and library use.
- ``single_sequence``: one-request loops, the reference the batched scheduler is checked against.
"""

from .inprocess import InProcessClient
from .request import FinishEvent, Request, SpeculativeRequest, TokenEvent
from .scheduler import BatchScheduler, QueueFull, SchedulerOptions
from .single_sequence import GenerationResult, generate_plain, generate_with_prompt_lookup
from .text_stream import TextStream
from .trace import TickRecord

__all__ = [
    "BatchScheduler", "FinishEvent", "GenerationResult", "InProcessClient", "QueueFull", "Request",
    "SchedulerOptions", "SpeculativeRequest", "TextStream", "TickRecord", "TokenEvent", "generate_plain",
    "generate_with_prompt_lookup",
]
