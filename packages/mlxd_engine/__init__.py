"""mlxd engine: model loading, KV storage (contiguous or paged), batched step, verify, sampler chains, the verify round.

The engine sees token ids only; tokenization happens at the edges (the tokenizer wrapper returned by
``load`` is carried along for the callers that need it).
"""

from .cache_layout import kv_bytes_per_token
from .eligibility import Eligibility, prompt_lookup_eligibility
from .embeddings import POOLINGS, EmbeddingRun, EmbeddingUnavailable, HiddenStateSource, hidden_state_source
from .engine import Engine
from .errors import GGUFError, KVStorageFull, ModelLoadError, PromptTooLong
from .finish_rule import ends_on, finish_reason, reaches_length
from .forward_cost import ForwardCost, calibrate_forward_cost
from .forward_sample import ForwardSample, timed_step
from .loading.cpu_weights import WeightForm, apply_cpu_weight_rule, default_budget_bytes
from .loading.default_model import EMBEDDED_ALIASES, resolve_default_model
from .loading.gguf_import import cached_conversion, convert_gguf
from .loading.loader import LoadedModel, embedded_model_path, load
from .memory import memory_usage, release_cached_memory
from .sampling.chain import SamplerChain, SamplingParams
from .sampling.grammar import GRAMMAR_KINDS, JSON_LAYOUT, Grammar, GrammarError, compile_grammar
from .sampling.grammar_limits import GrammarLimits
from .sequence import Emitted, Sequence, StepHandle
from .standalone import prefill_and_record, read_and_record, step_and_record
from .storage.kv_backend import STORAGE_BACKENDS, KVStorage, make_kv_storage
from .storage.kv_bound import at_kv_bound, kv_room
from .storage.kv_dtype import KV_DTYPES, parse_kv_dtype
from .storage.kv_storage import SlotKVStorage
from .verify_round import RoundOutcome, verify_round, verify_rows, verify_rows_timed

__all__ = [
    "EMBEDDED_ALIASES",
    "ForwardCost",
    "ForwardSample",
    "GGUFError",
    "calibrate_forward_cost",
    "WeightForm",
    "apply_cpu_weight_rule",
    "cached_conversion",
    "convert_gguf",
    "GRAMMAR_KINDS",
    "JSON_LAYOUT",
    "Grammar",
    "GrammarError",
    "GrammarLimits",
    "compile_grammar",
    "default_budget_bytes",
    "resolve_default_model",
    "Eligibility",
    "EmbeddingRun",
    "EmbeddingUnavailable",
    "Emitted",
    "HiddenStateSource",
    "POOLINGS",
    "hidden_state_source",
    "Engine",
    "KVStorage",
    "KVStorageFull",
    "LoadedModel",
    "ModelLoadError",
    "PromptTooLong",
    "RoundOutcome",
    "KV_DTYPES",
    "STORAGE_BACKENDS",
    "SamplerChain",
    "SamplingParams",
    "Sequence",
    "SlotKVStorage",
    "StepHandle",
    "at_kv_bound",
    "ends_on",
    "finish_reason",
    "reaches_length",
    "embedded_model_path",
    "kv_bytes_per_token",
    "kv_room",
    "load",
    "make_kv_storage",
    "parse_kv_dtype",
    "memory_usage",
    "prefill_and_record",
    "prompt_lookup_eligibility",
    "read_and_record",
    "release_cached_memory",
    "step_and_record",
    "timed_step",
    "verify_round",
    "verify_rows",
    "verify_rows_timed",
]
