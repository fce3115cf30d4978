"""mlxd engine: model loading, KV storage (contiguous or paged), batched step, verify, sampler chains, the verify round.

The engine sees token ids only; tokenization happens at the edges (the tokenizer wrapper returned by
``load`` is carried along for the callers that need it).
"""

from .eligibility import Eligibility, prompt_lookup_eligibility
from .engine import Emitted, Engine, Sequence, StepHandle, kv_bytes_per_token
from .kv_backend import STORAGE_BACKENDS, KVStorage, make_kv_storage
from .kv_bound import at_kv_bound, kv_room
from .kv_storage import KVStorageFull, SlotKVStorage
from .loading import LoadedModel, ModelLoadError, embedded_model_path, load
from .memory import memory_usage, release_cached_memory
from .sampling import SamplerChain, SamplingParams
from .verify_round import RoundOutcome, verify_round

__all__ = [
    "Eligibility", "Emitted", "Engine", "KVStorage", "KVStorageFull", "LoadedModel", "ModelLoadError",
    "RoundOutcome", "STORAGE_BACKENDS", "SamplerChain", "SamplingParams", "Sequence", "SlotKVStorage", "StepHandle",
    "at_kv_bound", "embedded_model_path", "kv_bytes_per_token", "kv_room", "load", "make_kv_storage",
    "memory_usage", "prompt_lookup_eligibility", "release_cached_memory", "verify_round",
]
