"""The stored responses of ``/v1/responses``: in memory, bounded, least recently used evicted first.

Contract: ``ResponsesStore`` keeps at most ``max_responses`` ``StoredResponse`` entries (the response
object as answered, and the whole conversation it ended, as the daemon's chat messages), by response id.
``get`` (a retrieve, or a use as ``previous_response_id``) makes an entry the most recently used; ``put``
beyond the limit evicts the least recently used one. Nothing is written to disk: a restart forgets every
response, and an evicted id answers as an unknown one. The gateway's event loop is its only user (no lock).

Worked example (``max_responses=2``): put a, put b, get a, put c -> b is evicted; a and c remain.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .schemas.responses_api import ResponseObject

DEFAULT_MAX_STORED_RESPONSES = 1024  # a long agent session is a few hundred turns


@dataclass
class StoredResponse:
    """One stored response."""

    reply: ResponseObject  # what POST answered (and GET answers again)
    # every message up to and including this response's output, without instructions (OpenAI does not
    # carry instructions over to the next response); the next turn's conversation starts with these
    conversation: list[dict]


class ResponsesStore:
    """Stored responses by id, at most ``max_responses`` of them (least recently used evicted)."""

    def __init__(self, max_responses: int = DEFAULT_MAX_STORED_RESPONSES) -> None:
        if max_responses < 1:
            raise ValueError("max_responses must be at least 1")
        self.max_responses = max_responses
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response_id: str, entry: StoredResponse) -> None:
        """Store ``entry`` under ``response_id``, evicting the least recently used beyond the limit."""
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.max_responses:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        """The entry (now the most recently used), or None for an id unknown, deleted or evicted."""
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        """Forget ``response_id``; False when it was not stored."""
        return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries
