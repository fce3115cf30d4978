"""The defaults a daemon serves with that more than one layer reads: the one place they are written down.

Contract: ``mlxd``'s options (``DaemonOptions``, whose values its command line shows and uses) and the
scheduler's (``SchedulerOptions``, for a library user) both take the batching defaults as their field
defaults, so a bare ``mlxd``, ``mlx-generate --local`` and a ``BatchScheduler`` built with no options batch
alike; the daemon's ``HostLimits`` and the engine's ``GrammarLimits`` both take the grammar bounds. Standard
library only: the scheduler and the engine may not import the daemon, and the daemon's options may not
load mlx (which importing the scheduler or the engine does), so the one home all can read is here, as with
``sampling_rules``. The values an option of mlxd takes that a tool passes on to a daemon it starts are
written here too (``REASONING_MODES``: ``mlxd --reasoning``, ``mlx-serve-http --reasoning``;
``KV_DTYPE_NAMES``: ``--kv-dtype`` of both; ``CPU_WEIGHT_FORMS``: ``--cpu-weights`` of both).
"""

MAX_BATCH = 8  # rows decoded together (mlxd --max-batch)
PREFILL_CHUNK = 512  # prompt tokens per prefill forward (--prefill-chunk)
LOOKAHEAD = True  # pipeline decode steps (--lookahead/--no-lookahead)
MAX_QUEUE = 256  # waiting requests before refusing (--max-queue)
DECODE_STEPS = 8  # most chained decode steps per tick in plain steady decode (--decode-steps)

# what one request's grammar or JSON schema may hold (mlxd --max-grammar-*; mlxd_engine's grammar_limits.py)
MAX_GRAMMAR_BYTES = 64 * 1024  # UTF-8 bytes of the grammar or schema text
MAX_GRAMMAR_RULES = 1000  # grammar rules, or maps (subschemas) of a JSON schema
MAX_GRAMMAR_DEPTH = 64  # nested groups, or nested maps and lists of a schema
MAX_GRAMMAR_REPEAT = 1000  # a repetition count, multiplied through nested groups

# mlxd --reasoning: thinking in the chat template, on (= auto) or off (mlxd_daemon/reasoning.py); mlx-serve-http
# takes the same values for a daemon it starts
REASONING_MODES = ("on", "off", "auto")

# mlxd --kv-dtype: the dtype float32 keys and values are kept in (mlxd_engine/storage/kv_dtype.py); mlx-serve-http
# takes the same values for a daemon it starts
KV_DTYPE_NAMES = ("float32", "float16")

# mlxd --cpu-weights (or MLXD_CPU_WEIGHTS): what the CPU backend does with a checkpoint's weights
# (mlxd_engine/loading/cpu_weights.py; kernel-int8: the opt-in int8-activation kernel); mlx-serve-http takes the
# same values for a daemon it starts
CPU_WEIGHT_FORMS = ("auto", "stored", "quantized", "kernel", "kernel-int8", "dequantized")
