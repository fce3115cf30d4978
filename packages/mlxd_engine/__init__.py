"""mlxd engine: model loading, slot KV storage, batched step, verify, sampler chains, the verify round.

The engine sees token ids only; tokenization happens at the edges (the tokenizer wrapper returned by
``load`` is carried along for the callers that need it).
"""

from .eligibility import Eligibility, prompt_lookup_eligibility
from .engine import Emitted, Engine, Sequence, StepHandle
from .kv_storage import KVStorageFull, SlotKVStorage
from .loading import LoadedModel, ModelLoadError, embedded_model_path, load
from .sampling import SamplerChain, SamplingParams
from .verify_round import RoundOutcome, verify_round

__all__ = [
    "Eligibility", "Emitted", "Engine", "KVStorageFull", "LoadedModel", "ModelLoadError", "RoundOutcome",
    "SamplerChain", "SamplingParams", "Sequence", "SlotKVStorage", "StepHandle", "embedded_model_path",
    "load", "prompt_lookup_eligibility", "verify_round",
]
