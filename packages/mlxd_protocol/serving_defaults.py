"""The batching defaults a daemon serves with: the one place they are written down.

Contract: ``mlxd``'s options (``DaemonOptions``, whose values its command line shows and uses) and the
scheduler's (``SchedulerOptions``, for a library user) both take these as their field defaults, so a bare
``mlxd``, ``mlx-generate --local`` and a ``BatchScheduler`` built with no options batch alike. Standard
library only: the scheduler may not import the daemon, and the daemon's options may not load mlx (which
importing the scheduler does), so the one home both can read is here, as with ``sampling_rules``.
"""

MAX_BATCH = 8  # rows decoded together (mlxd --max-batch)
PREFILL_CHUNK = 512  # prompt tokens per prefill forward (--prefill-chunk)
LOOKAHEAD = True  # pipeline decode steps (--lookahead/--no-lookahead)
MAX_QUEUE = 256  # waiting requests before refusing (--max-queue)
DECODE_STEPS = 8  # most chained decode steps per tick in plain steady decode (--decode-steps)
