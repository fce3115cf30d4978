"""The client interface: what every blocking mlxd client offers, whatever carries the messages.

Two implementations (vLLM's in-process / multiprocess pair): ``Client`` sends the messages over a
ZeroMQ socket to a daemon process; ``LocalClient`` hands them to the daemon's core running in this
process. Both speak the same ``Generate`` / ``Chunk`` / ``Done`` (and ``Status``, ``Tokenize``, ...)
messages with the same rules: ``generate`` yields Chunks then the Done, an Error reply raises
``DaemonError``, leaving a stream early cancels the request. Code written against ``DaemonClient``
runs on either (``mlx-generate`` does: ``--local`` picks the in-process one).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from .messages import Chunk, Done, EmbedResult, Generate, Status


@runtime_checkable
class DaemonClient(Protocol):
    def generate(self, request: Generate) -> Iterator[Chunk | Done]:
        """Send a Generate; iterate over its Chunks, then its Done."""

    def status(self) -> Status:
        """The daemon's Status."""

    def hello(self, client: str = ...) -> Status:
        """Introduce this client; answered by the Status."""

    def ping(self, timeout_s: float = ...) -> bool:
        """True when the daemon answers; never raises."""

    def tokenize(
        self,
        text: str | None = None,
        messages: list[dict] | None = None,
        add_special_tokens: bool = True,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
        continue_final_message: bool = False,
    ) -> list[int]:
        """Token ids of text, or of chat messages (with ``tools``, template variables, a continued final
        message) through the chat template."""

    def render_chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict | None = None,
        continue_final_message: bool = False,
    ) -> str:
        """The prompt text of chat messages through the chat template (llama-server's /apply-template)."""

    def detokenize(self, tokens: list[int]) -> str:
        """The text of token ids."""

    def embed(
        self,
        texts: list[str] | None = None,
        token_inputs: list[list[int]] | None = None,
        pooling: str | None = None,
        normalize: bool = True,
    ) -> EmbedResult:
        """Embeddings of texts or token lists: the model's last hidden state, pooled per input."""

    def cancel(self, request_id: str) -> None:
        """Stop a generation (its stream ends with a cancelled Done)."""

    def shutdown(self) -> None:
        """Ask the daemon to stop."""

    def close(self) -> None:
        """Release the client; safe to call twice."""

    def __enter__(self) -> DaemonClient: ...

    def __exit__(self, *exc_info: object) -> None: ...
