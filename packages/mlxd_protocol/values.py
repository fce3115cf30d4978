"""The base every wire message shares and the nested values requests carry: ``Sampling``, ``Speculative``,
``Constraint`` (maps inside a ``Generate``).

Contract: plain dataclasses with a ``validate()`` that raises ``FieldError``; ``messages`` re-exports every
name here with the message types.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from .codes import CONSTRAINT_KINDS, MAX_DRAFT_LIMIT, SPECULATIVE_KINDS
from .request_checks import require
from .sampling_rules import GREEDY, sampling_problem


class Message:
    """Base of every wire message; ``TYPE`` is the frame's "type" string."""

    __slots__ = ()
    TYPE: ClassVar[str] = ""
    if TYPE_CHECKING:  # every request, reply and tick has an id field; nested values (Sampling, ...) do not
        id: str | None

    def validate(self) -> None:
        """Check values once their types are right; raise FieldError naming the field. No-op here."""


@dataclass(slots=True)
class Sampling(Message):
    """Sampler settings; the defaults (``sampling_rules.GREEDY``) mean greedy decoding with every filter off.

    Also the type of the daemon's own default settings (``mlxd --temp/--top-p/--top-k/--min-p``).
    """

    temperature: float = GREEDY["temperature"]
    top_k: int = GREEDY["top_k"]
    top_p: float = GREEDY["top_p"]
    min_p: float = GREEDY["min_p"]
    repetition_penalty: float = GREEDY["repetition_penalty"]
    presence_penalty: float = GREEDY["presence_penalty"]
    frequency_penalty: float = GREEDY["frequency_penalty"]
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    logprobs: int | None = None
    # the logprobs describe the distribution the sampler draws from (after top_k, top_p, min_p and the
    # temperature; tokens they filter out are left out) instead of the model's (llama-server's post_sampling_probs)
    post_sampling: bool = False
    # the random generator of a seeded draw: "mlx" (MLX's keys), or "llama.cpp" (llama.cpp's sampler chain
    # and std::mt19937: the same sampled text as llama-server for a seed, on the same logits)
    rng: str = "mlx"

    def validate(self) -> None:
        problem = sampling_problem(self)  # the vocabulary-bound rules are checked where the model is known
        require(problem is None, problem or "")


@dataclass(slots=True)
class Speculative(Message):
    """Speculative decoding choice; None fields mean "the daemon's default"."""

    kind: str | None = None
    max_draft: int | None = None

    def validate(self) -> None:
        require(
            self.kind is None or self.kind in SPECULATIVE_KINDS,
            f"speculative.kind: must be one of {sorted(SPECULATIVE_KINDS)} or nil",
        )
        require(
            self.max_draft is None or 0 <= self.max_draft <= MAX_DRAFT_LIMIT,
            f"speculative.max_draft: must be in [0, {MAX_DRAFT_LIMIT}]",
        )


@dataclass(slots=True)
class Constraint(Message):
    """Structured output: the output must follow a JSON schema or a grammar (the daemon masks every other token).

    ``kind``: "json_object" (any JSON object; ``text`` nil), "json_schema" (``text`` is the schema as JSON
    text), "gbnf" (llama.cpp's GBNF), "lark" (llguidance's Lark dialect), "regex". A schema or grammar the
    daemon's grammar library rejects is answered with an invalid_request Error carrying its message.
    """

    kind: str
    text: str | None = None

    def validate(self) -> None:
        require(self.kind in CONSTRAINT_KINDS, f"constraint.kind: must be one of {sorted(CONSTRAINT_KINDS)}")
        require(self.kind == "json_object" or bool(self.text), f"constraint.text: required for kind {self.kind!r}")
