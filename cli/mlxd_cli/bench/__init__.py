"""``mlx-bench``: serving benchmark of mlxd and any OpenAI-compatible server, side by side in one run.

Modules: ``prompts`` (synthetic paragraphs, the plain and copy styles), ``targets`` (HTTP, daemon and
started servers; one timed request each), ``runner`` (warm-up, interleaved rounds, concurrency),
``stats`` (percentiles, spreads, ratios), ``report`` (rich table, markdown, JSON, plots), ``main``
(the click command). Like every CLI tool here it never imports mlx.
"""
