"""Quantized mixture-of-experts models on the CPU kernel, token-equal to mlx-lm's own loop.

The experts' layers (mlx-lm's ``QuantizedSwitchLinear``: ``mx.gather_qmm``) stay quantized and run on
``mlxd_qmatmul.gather_quantized_matmul``, as the model's other quantized layers run on the kernel; before,
one experts layer kept the whole model off the kernel. For each case (tiny random weights from mlx-lm's own
classes, quantized with ``nn.quantize``), greedy: alone through the engine equals mlx-lm's loop on the same
quantized model (MLX's own quantized kernels), three rows at different positions equal each alone (their
prompts route many rows to each expert: mlx-lm's sorted path and the kernel's many-rows path), and prompt
lookup equals plain decode.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

import mlxd_qmatmul

from .architectures import alone, available, batched, build, loaded, mlx_lm_greedy, prompt

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not mlxd_qmatmul.available(), reason=mlxd_qmatmul.unavailable_reason()),
]

NEW_TOKENS = 24
PROMPT_LENGTHS = (150, 90, 40)


@pytest.mark.parametrize("name", ["qwen3_moe", "gpt_oss", "deepseek_v3"])
@pytest.mark.parametrize("bits, group_size", [(4, 32), (8, 64)])
def test_quantized_experts_run_on_the_kernel_token_equal_to_mlx_lm(name, bits, group_size):
    if not available(name):
        pytest.skip(f"the installed mlx-lm has no {name}")
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    from mlxd_engine import Engine
    from mlxd_engine.loading.cpu_weights import apply_cpu_weight_rule
    from mlxd_engine.loading.kernel_layers import KernelQuantizedSwitchLinear
    from mlxd_scheduler.single_sequence import generate_with_prompt_lookup

    model = build(name, seed=3)

    def quantizable(path, module):  # the tiny cases' router gates are narrower than a group
        return hasattr(module, "to_quantized") and module.weight.shape[-1] % group_size == 0

    nn.quantize(model, group_size=group_size, bits=bits, class_predicate=quantizable)
    mx.eval(model.parameters())
    prompts = [prompt(length, seed) for seed, length in enumerate(PROMPT_LENGTHS)]
    reference = mlx_lm_greedy(model, prompts[0], NEW_TOKENS)

    form = apply_cpu_weight_rule(model, choice="kernel")
    assert form.form == "kernel quantized", form.detail
    experts = [m for _, m in model.named_modules() if isinstance(m, QuantizedSwitchLinear)]
    assert experts and all(type(m) is KernelQuantizedSwitchLinear for m in experts)
    assert all(m["weight"].dtype == mx.uint32 for m in experts)  # still quantized in memory

    engine = Engine(loaded(name, model=model), max_sequences=4)
    singles = [alone(engine, p, NEW_TOKENS) for p in prompts]
    assert singles[0] == reference, f"{name}: the experts on the kernel differ from mlx-lm's loop"
    rows = batched(engine, prompts, NEW_TOKENS)
    for i, (row, single) in enumerate(zip(rows, singles)):
        assert row == single, f"{name}: batched row {i} differs from it alone"
    assert generate_with_prompt_lookup(engine, prompts[0], NEW_TOKENS).tokens == singles[0]


def test_a_saved_mixed_precision_experts_checkpoint_loads_onto_the_kernel(tmp_path, monkeypatch):
    """The loader's own path: mlx-lm builds the quantized layers from the saved config (a 6-bit experts layer,
    4-bit others, bfloat16 scales); ``load`` with the kernel chosen puts them all on it, and greedy output through the
    engine equals the same checkpoint with every layer dequantized to float32."""
    import json

    from mlx_lm.models import qwen3_moe
    from mlx_lm.utils import load_tokenizer, save

    from mlxd_engine import Engine, load
    from mlxd_engine.loading.kernel_layers import KernelQuantizedSwitchLinear
    from mlxd_engine.loading.loader import embedded_model_path
    from mlxd_scheduler.single_sequence import generate_plain

    from .architectures import ARCHITECTURES

    source = embedded_model_path()
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    config = dict(ARCHITECTURES["qwen3_moe"][1], vocab_size=vocab)
    mx.random.seed(5)
    model = qwen3_moe.Model(qwen3_moe.ModelArgs.from_dict(config))
    model.set_dtype(mx.bfloat16)

    def recipe(path, module):
        if not hasattr(module, "to_quantized") or path.endswith(".gate"):  # the router stays float
            return False
        return {"group_size": 32, "bits": 6 if "layers.1.mlp.switch_mlp.down_proj" in path else 4}

    nn.quantize(model, class_predicate=recipe)
    config["quantization"] = {"group_size": 32, "bits": 4}
    config["quantization"].update({"model.layers.1.mlp.switch_mlp.down_proj": {"group_size": 32, "bits": 6}})
    save(tmp_path, source, model, load_tokenizer(source), config)

    # the kernel, not the load-time timing's pick: on a model this small the kernel and float32 weights take
    # about the same time, and the timing may go either way
    monkeypatch.setenv("MLXD_CPU_WEIGHTS", "kernel")
    loaded = load(tmp_path)
    assert "repacked exactly from 6 bits" in loaded.weights, loaded.weights
    down = loaded.model.model.layers[1].mlp.switch_mlp.down_proj
    assert type(down) is KernelQuantizedSwitchLinear and down.bits == 8
    monkeypatch.setenv("MLXD_CPU_WEIGHTS", "dequantized")
    dense = load(tmp_path)
    prompt = [(11 * i + 5) % vocab for i in range(70)]
    want = generate_plain(Engine(dense, max_sequences=1), prompt, 24).tokens
    assert generate_plain(Engine(loaded, max_sequences=1), prompt, 24).tokens == want
