"""Sampling: turning a row's logits into a token.

``chain`` (``SamplingParams``, ``SamplerChain``, batched ``sample_rows``), ``grammar`` (constrained decoding
through llguidance) and ``grammar_limits`` (what a schema or grammar may ask, checked before compiling).
"""
