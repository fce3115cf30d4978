"""mlxd scheduler: runs sequences on the engine, with or without prompt-lookup drafting.

``single_sequence`` is the one-request loop (the reference the batched scheduler is checked against).
"""

from .single_sequence import GenerationResult, generate_plain, generate_with_prompt_lookup

__all__ = ["GenerationResult", "generate_plain", "generate_with_prompt_lookup"]
