"""Whose shared draft store a request drafts from: one store per API key.

Contract: the daemon keeps a shared draft store per ``Generate.draft_key`` so that nothing one key's requests
produced is drafted into another key's (drafts never change an output, but their timing can tell of it).
``key_id(key)`` names an API key for that purpose without the key itself ever reaching the daemon (a
SHA-256 prefix). The middleware sets ``REQUEST_DRAFT_KEY`` to the id of the key a request was let in with,
for the request's own task (and the tasks it starts); ``with_draft_key(message)`` gives a Generate that
id unless it names one already. Without API keys every request's id is None: the daemon's one store.
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar

from mlxd_protocol import Generate

REQUEST_DRAFT_KEY: ContextVar[str | None] = ContextVar("mlxd_request_draft_key", default=None)


def key_id(key: str) -> str:
    """A stable name for an API key that does not reveal it."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def with_draft_key(message: Generate) -> Generate:
    """``message`` drafting from the store of the key its HTTP request came with (unchanged when it names
    a store already, or the request came with none)."""
    if message.draft_key is None:
        message.draft_key = REQUEST_DRAFT_KEY.get()
    return message
