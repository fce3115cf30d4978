"""Tiny random-weight models of mlx-lm's own architectures, built in the test (no downloads).

``ARCHITECTURES`` maps a case name to the mlx-lm module and the config its ``ModelArgs`` are made from;
``build(name)`` returns the model with evaluated weights and ``loaded(name)`` a ``LoadedModel`` around it
(no tokenizer: the engine sees token ids only). Sizes are tiny (hidden 64, 2-4 layers, vocabulary 128),
sliding windows 16 tokens, so a context of a few hundred tokens passes both the window and the storage's
first 256-token capacity chunk.
"""

from __future__ import annotations

import importlib
import random

from mlxd_engine import prefill_and_record, step_and_record

VOCAB = 128
WINDOW = 16

_BASE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    vocab_size=VOCAB,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


def _with(**fields) -> dict:
    return {**_BASE, **fields}


# case name -> (mlx-lm module, config dict for ModelArgs.from_dict)
ARCHITECTURES: dict[str, tuple[str, dict]] = {
    "llama": ("llama", _with(model_type="llama", num_hidden_layers=2)),
    "qwen3": ("qwen3", _with(model_type="qwen3", num_hidden_layers=2, tie_word_embeddings=True)),
    "qwen3_moe": (
        "qwen3_moe",
        _with(
            model_type="qwen3_moe",
            num_hidden_layers=2,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            moe_intermediate_size=32,
            norm_topk_prob=True,
        ),
    ),
    "qwen3_5": (
        "qwen3_5",
        dict(
            model_type="qwen3_5",
            text_config=_with(
                model_type="qwen3_5_text",
                num_hidden_layers=4,
                linear_num_value_heads=2,
                linear_num_key_heads=2,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                full_attention_interval=4,
            ),
        ),
    ),
    "qwen3_5_moe": (
        "qwen3_5_moe",
        dict(
            model_type="qwen3_5_moe",
            text_config=_with(
                model_type="qwen3_5_moe_text",
                num_hidden_layers=4,
                linear_num_value_heads=2,
                linear_num_key_heads=2,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                full_attention_interval=4,
                num_experts=4,
                num_experts_per_tok=2,
                decoder_sparse_step=1,
                shared_expert_intermediate_size=32,
                moe_intermediate_size=32,
            ),
        ),
    ),
    "qwen3_next": (
        "qwen3_next",
        _with(
            model_type="qwen3_next",
            num_hidden_layers=4,
            linear_num_value_heads=2,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            num_experts=4,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            shared_expert_intermediate_size=32,
            mlp_only_layers=[],
            moe_intermediate_size=32,
            partial_rotary_factor=0.25,
        ),
    ),
    # 4 query heads on 2 KV heads: gemma2's attention splits them into 5-D scores [B, kv, repeats, n, L]
    "gemma2": (
        "gemma2",
        {
            k: v
            for k, v in _with(model_type="gemma2", num_hidden_layers=2, query_pre_attn_scalar=16).items()
            if k != "max_position_embeddings"
        },
    ),
    "gemma3_text": (
        "gemma3_text",
        _with(
            model_type="gemma3_text",
            num_hidden_layers=4,
            sliding_window=WINDOW,
            sliding_window_pattern=2,
            query_pre_attn_scalar=16,
        ),
    ),
    "gemma4_text": (
        "gemma4_text",
        _with(
            model_type="gemma4_text",
            num_hidden_layers=4,
            global_head_dim=32,
            vocab_size_per_layer_input=VOCAB,
            hidden_size_per_layer_input=8,
            num_kv_shared_layers=0,
            sliding_window=WINDOW,
            sliding_window_pattern=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        ),
    ),
    # the last two layers own no cache: they reuse the K/V of the last earlier layer of their type
    "gemma4_text_kv_shared": (
        "gemma4_text",
        _with(
            model_type="gemma4_text",
            num_hidden_layers=4,
            global_head_dim=32,
            vocab_size_per_layer_input=VOCAB,
            hidden_size_per_layer_input=8,
            num_kv_shared_layers=2,
            sliding_window=WINDOW,
            sliding_window_pattern=2,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        ),
    ),
    "gpt_oss": (
        "gpt_oss",
        {
            k: v
            for k, v in _with(
                model_type="gpt_oss",
                num_hidden_layers=2,
                num_local_experts=4,
                num_experts_per_tok=2,
                intermediate_size=64,
                sliding_window=WINDOW,
                layer_types=["sliding_attention", "full_attention"],
            ).items()
            if k != "max_position_embeddings"
        },
    ),
    "deepseek_v3": (
        "deepseek_v3",
        _with(
            model_type="deepseek_v3",
            num_hidden_layers=2,
            num_key_value_heads=4,
            moe_intermediate_size=32,
            n_shared_experts=1,
            n_routed_experts=4,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            v_head_dim=16,
            qk_nope_head_dim=16,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
        ),
    ),
    # a wrapped config: every text fact lives under text_config
    "mistral3": ("mistral3", dict(model_type="mistral3", text_config=_with(model_type="mistral", num_hidden_layers=2))),
    "ministral3": (
        "ministral3",
        _with(
            model_type="ministral3",
            num_hidden_layers=2,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "llama_4_scaling_beta": 0.1,
                "original_max_position_embeddings": 4096,
            },
        ),
    ),
    "phi3": ("phi3", _with(model_type="phi3", num_hidden_layers=2)),
    "olmo3": ("olmo3", _with(model_type="olmo3", num_hidden_layers=4, sliding_window=WINDOW)),
    "smollm3": ("smollm3", _with(model_type="smollm3", num_hidden_layers=4)),
    "llama4_text": (
        "llama4_text",
        {
            k: v
            for k, v in _with(
                model_type="llama4_text",
                num_hidden_layers=2,
                intermediate_size_mlp=128,
                no_rope_layers=[1, 0],
                use_qk_norm=True,
            ).items()
            if k != "max_position_embeddings"
        },
    ),
    "lfm2": (
        "lfm2",
        _with(
            model_type="lfm2",
            num_hidden_layers=4,
            norm_eps=1e-5,
            conv_bias=False,
            conv_L_cache=3,
            block_dim=64,
            block_multiple_of=16,
            block_ffn_dim_multiplier=1.0,
            block_auto_adjust_ff_dim=False,
            layer_types=["conv", "full_attention", "conv", "full_attention"],
        ),
    ),
    "granitemoehybrid": (
        "granitemoehybrid",
        _with(
            model_type="granitemoehybrid",
            num_hidden_layers=2,
            attention_bias=False,
            embedding_multiplier=1.0,
            attention_multiplier=0.25,
            logits_scaling=1.0,
            residual_multiplier=1.0,
            layer_types=["mamba", "attention"],
            mamba_n_heads=4,
            mamba_d_head=16,
            mamba_proj_bias=False,
            mamba_d_state=16,
            mamba_d_conv=4,
            mamba_n_groups=1,
            mamba_conv_bias=True,
            shared_intermediate_size=128,
        ),
    ),
    # "M" mamba, "*" attention, "-" MLP (no cache: three layers, two cache entries)
    "nemotron_h": (
        "nemotron_h",
        _with(
            model_type="nemotron_h",
            num_hidden_layers=3,
            attention_bias=False,
            mamba_num_heads=8,
            mamba_head_dim=16,
            mamba_proj_bias=False,
            ssm_state_size=16,
            conv_kernel=4,
            n_groups=1,
            mlp_bias=False,
            layer_norm_epsilon=1e-5,
            use_bias=False,
            use_conv_bias=True,
            hybrid_override_pattern="M*-",
        ),
    ),
    "falcon_h1": (
        "falcon_h1",
        _with(
            model_type="falcon_h1",
            num_hidden_layers=2,
            mamba_d_conv=4,
            mamba_d_head=16,
            mamba_d_ssm=64,
            mamba_d_state=16,
            mamba_n_heads=4,
            mamba_n_groups=1,
            mamba_chunk_size=16,
        ),
    ),
    # llama4 (the multimodal wrapper): chunked attention in three of every four layers
    "llama4": (
        "llama4",
        dict(
            model_type="llama4",
            text_config=_with(
                model_type="llama4_text",
                num_hidden_layers=4,
                attention_bias=False,
                attention_chunk_size=32,
                interleave_moe_layer_step=2,
                intermediate_size_mlp=128,
                num_experts_per_tok=1,
                num_local_experts=2,
                rope_scaling=None,
                use_qk_norm=True,
            ),
        ),
    ),
    "mamba2": (
        "mamba2",
        dict(
            model_type="mamba2",
            num_heads=8,
            head_dim=16,
            expand=2,
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            state_size=16,
            num_hidden_layers=2,
            layer_norm_epsilon=1e-5,
            conv_kernel=4,
            n_groups=1,
            use_bias=False,
            use_conv_bias=True,
            tie_word_embeddings=True,
            time_step_limit=(0.0, float("inf")),
            time_step_rank=4,
        ),
    ),
}


def available(name: str) -> bool:
    """Whether the installed mlx-lm has the case's architecture."""
    try:
        importlib.import_module(f"mlx_lm.models.{ARCHITECTURES[name][0]}")
    except ImportError:
        return False
    return True


def build(name: str, seed: int = 0):
    """The case's mlx-lm model with random weights (evaluated)."""
    import mlx.core as mx

    module_name, config = ARCHITECTURES[name]
    module = importlib.import_module(f"mlx_lm.models.{module_name}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(dict(config)))
    mx.eval(model.parameters())
    return model


def loaded(name: str, seed: int = 0, model=None):
    """A ``LoadedModel`` around the case's model, as tests/conftest.py's ``tiny_random_model``."""
    from mlxd_engine import LoadedModel
    from mlxd_engine.cache_layout import model_layers

    model = model if model is not None else build(name, seed)
    return LoadedModel(
        model=model,
        tokenizer=None,
        path=f"<random {name}>",
        model_type=ARCHITECTURES[name][1]["model_type"],
        n_layers=len(model_layers(model)),
        vocab_size=VOCAB,
        eos_token_ids=frozenset(),
        context_length=4096,
    )


def prompt(length: int, seed: int) -> list[int]:
    """Random token ids (no EOS: the cases have none)."""
    rng = random.Random(seed)
    return [rng.randrange(1, VOCAB) for _ in range(length)]


def repeating_prompt(length: int, period: int, seed: int) -> list[int]:
    """A random pattern of ``period`` ids repeated to ``length`` (random models copy more after it)."""
    return (prompt(period, seed) * (length // period + 1))[:length]


# recurrent case -> (model seed, prompt) where the random model repeats itself, so prompt lookup accepts
# drafts (found by trying seeds; the exactness checks do not depend on it)
LOOKUP_CASES = {
    "qwen3_5": (0, lambda: prompt(230, 2)),
    "qwen3_5_moe": (1, lambda: repeating_prompt(230, 2, 2)),
    "qwen3_next": (4, lambda: repeating_prompt(230, 12, 0)),
    "lfm2": (0, lambda: prompt(230, 0)),
    "granitemoehybrid": (0, lambda: repeating_prompt(230, 12, 2)),
    "nemotron_h": (1, lambda: repeating_prompt(230, 12, 2)),
    "mamba2": (0, lambda: repeating_prompt(230, 12, 0)),
    "falcon_h1": (0, lambda: repeating_prompt(230, 12, 1)),
}


def mlx_lm_greedy(model, tokens: list[int], n: int) -> list[int]:
    """mlx-lm's own loop: ``generate_step`` with an argmax sampler, ``n`` tokens."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    steps = generate_step(mx.array(tokens), model, max_tokens=n, sampler=lambda logits: mx.argmax(logits, axis=-1))
    return [int(token) for token, _ in steps]


def alone(engine, tokens: list[int], n: int) -> list[int]:
    """``n`` greedy tokens of one row through the engine (the single-sequence plain loop)."""
    from mlxd_scheduler.single_sequence import generate_plain

    return generate_plain(engine, tokens, n).tokens


def batched(engine, prompts: list[list[int]], n: int) -> list[list[int]]:
    """``n`` greedy tokens of every prompt, prefilled one by one, then stepped together (rows at different
    positions when the prompts differ in length)."""
    rows = [engine.add_sequence(p) for p in prompts]
    for row in rows:
        prefill_and_record(engine, row)
    for _ in range(n - 1):
        step_and_record(engine, rows)
    outputs = [list(row.output) for row in rows]
    for row in rows:
        engine.release(row)
    return outputs
