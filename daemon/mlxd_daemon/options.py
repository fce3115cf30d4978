"""Daemon options: what ``mlxd`` was started with, reported in its status."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from mlxd_protocol import Sampling, serving_defaults

from .host_limits import HostLimits

# The daemon's default sampler settings (mlxd --temp/--top-p/--top-k/--min-p), used for a Generate that
# sends no "sampling": a wire Sampling, so its fields, defaults and rules are the protocol's.
SamplingDefaults = Sampling


@dataclass
class DaemonOptions:
    model: str | None = None  # None: the default model (model_setup.py); "embedded": the embedded tiny model
    endpoint: str | None = None  # None: the default private ipc endpoint
    max_batch: int = serving_defaults.MAX_BATCH
    max_kv_size: int | None = None  # None: the model's context length
    prefill_chunk: int = serving_defaults.PREFILL_CHUNK
    lookahead: bool = serving_defaults.LOOKAHEAD
    decode_steps: int = serving_defaults.DECODE_STEPS  # most chained decode steps per tick in steady decode
    max_queue: int = serving_defaults.MAX_QUEUE
    allow_public: bool = False
    drain_timeout_s: float = 30.0  # SIGTERM: how long in-flight requests may run before they are cancelled
    log_level: str = "info"
    sampling: Sampling = field(default_factory=Sampling)
    draft_kind: str | None = None
    draft_model: str | None = None
    draft_block_size: int | None = None
    prompt_lookup_max_batch: int | None = None  # None: the scheduler's default (no bound: the verify gate decides)
    context_shift: bool = False  # llama-server's --context-shift (mlxd_scheduler/context_shift.py)
    # the shared draft store: prompt lookup also drafts from earlier requests' tokens (one store per API key)
    shared_drafts: bool = True
    shared_draft_tokens: int = 32768  # tokens all keys' stores keep together (oldest requests evicted first)
    shared_draft_prompts: bool = False  # store whole prompts too, not only outputs
    storage_backend: str = "contiguous"  # or "paged"
    kv_block_size: int = 64
    kv_dtype: str = "float32"  # or "float16": float32 keys and values kept at half the bytes (storage/kv_dtype.py)
    kv_pool_tokens: int | None = None  # paged pool size; None: from kv_memory_fraction, else max_batch x max_kv_size
    kv_memory_fraction: float | None = None  # paged pool as a fraction of the machine's memory
    # prefix cache: bytes kept of finished requests' prompt + output state (None: a quarter of the KV bound,
    # at most a tenth of this machine's memory; 0: off)
    prefix_cache_bytes: int | None = None
    cpu_weight_budget: float = 0.4  # CPU: share of the machine's memory float32 weights may take (cpu_weights.py)
    cpu_weights: str | None = None  # CPU: the weight rule's choice (CPU_WEIGHT_FORMS); None: MLXD_CPU_WEIGHTS or auto
    stream_interval_s: float = 0.005  # a streaming request gets at most one chunk per interval (0: per token)
    distributed: str | None = None  # "tensor" or "pipeline": this process is one rank of an mx.distributed group
    distributed_backend: str = "any"  # mx.distributed backend (mlx.launch sets it up): any, ring, jaccl, mpi, nccl
    auth_token: str | None = field(default=None, repr=False)  # clients must send it in a Hello first
    chat_template: str | None = None  # Jinja text used instead of the model's chat template (None: the model's)
    pooling: str = "mean"  # how an Embed's token states become one vector: mean, last, cls or none
    reasoning: str = "auto"  # thinking in the chat template: on (= auto) or off (reasoning.py)
    host_workers: int = 2  # threads for host work off the loop: templates, tokenizing, grammars (host_work.py)
    limits: HostLimits = field(default_factory=HostLimits)  # per-request bounds on host work (host_limits.py)

    def as_dict(self) -> dict:
        summary = asdict(self)
        summary["auth_token"] = "<set>" if self.auth_token else None  # never report the secret
        return summary
