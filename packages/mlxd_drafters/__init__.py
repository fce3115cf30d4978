"""mlxd_drafters: pure-Python prompt-lookup drafting for speculative decoding.

Contract: standard library only (no mlx/numpy), so it is importable and
testable anywhere. The engine feeds committed tokens to a
``PromptLookupDrafter``, asks it for ``draft_block()`` proposals, and reports
each verify round back with ``accept_verified_tokens`` (or withdraws an
unverified proposal with ``retract_draft``); a ``SharedDraftStore`` (one per
API key, ``SharedDraftStores``) adds earlier requests' tokens as a source; its ``pacing`` (``DraftPacing``) says
when a caller that declined its drafts asks it again.
"""

from mlxd_drafters.config import KNOWN_POLICIES, PromptLookupConfig
from mlxd_drafters.governor import DraftGovernor
from mlxd_drafters.ngram_index import NgramIndex, TokenView
from mlxd_drafters.pacing import DraftPacing
from mlxd_drafters.prompt_lookup import DRAFT_SOURCES, PromptLookupDrafter, PromptLookupStats
from mlxd_drafters.shared_store import SharedDraft, SharedDraftStore, SharedDraftStores, SharedStoreConfig

__all__ = [
    "DRAFT_SOURCES",
    "KNOWN_POLICIES",
    "DraftGovernor",
    "DraftPacing",
    "NgramIndex",
    "PromptLookupConfig",
    "PromptLookupDrafter",
    "PromptLookupStats",
    "SharedDraft",
    "SharedDraftStore",
    "SharedDraftStores",
    "SharedStoreConfig",
    "TokenView",
]
