"""mlxd over mx.distributed on one machine: ranks over the ring backend on loopback.

Greedy output of a group equals the single-process daemon's, with and without prompt lookup, several
requests at once, in tensor parallel (the embedded qwen3; SmolLM2 over 3 ranks, whose 9 attention heads
do not split over 2) and pipeline parallel (a tiny random deepseek_v3 checkpoint written here with the
embedded model's tokenizer: neither the embedded model's qwen3 nor SmolLM2's llama has mlx-lm's
``pipeline``). A model without the mode, or whose heads do not split, is refused naming it. Killing a
rank fails the requests in flight with the reason within a few seconds and ends the other ranks.

Ranks are started as ``mlx.launch --backend ring`` starts them (``MLX_RANK`` and an ``MLX_HOSTFILE`` of
127.0.0.1 ports), one test through ``mlx.launch`` itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from mlxd_protocol import Client, DaemonError, Generate, Speculative

from ..model_paths import SMOLLM2
from .conftest import private_endpoint, start_daemon, stop_daemon

ROOT = Path(__file__).resolve().parents[2]
MLXD = [sys.executable, "-m", "mlxd_daemon"]
COPY = (
    "Repeat the following paragraph exactly: The quick brown fox jumps over the lazy dog. "
    "A stitch in time saves nine, and the early bird catches the worm."
)
PROMPTS = [COPY, "Write number 1 story", "Tell me about the sea."]
LONG = " ".join([COPY] * 40)  # over 1000 tokens: its admission's plan passes the 4 KiB first broadcast
ENV = dict(os.environ, PYTHONUNBUFFERED="1", MLXD_BLAS_THREADS="1", MLXD_OFFLINE="1")


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _hostfile(ranks: int) -> str:
    path = Path(tempfile.mkdtemp(prefix="mlxd-ring-")) / "hosts.json"
    path.write_text(json.dumps([[f"127.0.0.1:{port}"] for port in _free_ports(ranks)]))
    return str(path)


class Group:
    """``ranks`` mlxd processes of one ring group; rank 0 serves at ``endpoint``."""

    def __init__(self, ranks: int, *args: str, wait_ready: bool = True, timeout_s: float = 180.0):
        self.endpoint = private_endpoint("g")
        hostfile = _hostfile(ranks)
        self.processes = [
            subprocess.Popen(
                [*MLXD, "--endpoint", self.endpoint, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=dict(ENV, MLX_RANK=str(rank), MLX_HOSTFILE=hostfile),
            )
            for rank in range(ranks)
        ]
        if wait_ready:
            line = self.processes[0].stdout.readline()
            if not line.startswith("mlxd ready"):
                self.kill()
                raise RuntimeError(f"rank 0 did not start: {line!r} {self.processes[0].stderr.read()[-3000:]}")

    def wait(self, timeout_s: float = 60.0) -> list[int]:
        return [p.wait(timeout=timeout_s) for p in self.processes]

    def stderr(self, rank: int) -> str:
        return self.processes[rank].stderr.read()

    def kill(self) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.kill()
            p.wait()


def _done(endpoint: str, prompt: str, max_tokens: int, prompt_lookup: bool):
    request = Generate(
        id=uuid.uuid4().hex,
        prompt=prompt,
        max_tokens=max_tokens,
        stream=False,
        speculative=Speculative(kind="prompt-lookup" if prompt_lookup else "none"),
    )
    with Client(endpoint, timeout_s=120.0) as client:
        (done,) = list(client.generate(request))
    return done


def _generate(endpoint: str, prompt: str, max_tokens: int, prompt_lookup: bool) -> list[int]:
    return list(_done(endpoint, prompt, max_tokens, prompt_lookup).tokens)


def _outputs(endpoint: str, prompts: list[str], max_tokens: int, at_once: bool = True) -> dict:
    """Every prompt with prompt lookup off and on, all sent at once (the scheduler batches them), or one
    after the other."""
    results: dict = {}

    def run(key):
        results[key] = _generate(endpoint, key[0], max_tokens, key[1])

    keys = [(p, lookup) for p in prompts for lookup in (False, True)]
    if not at_once:
        for key in keys:
            run(key)
        return results
    threads = [threading.Thread(target=run, args=(key,)) for key in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _single_process(model_args: list[str], prompts: list[str], max_tokens: int, at_once: bool = True) -> dict:
    endpoint = private_endpoint("s")
    process = start_daemon(endpoint, *model_args)
    try:
        return _outputs(endpoint, prompts, max_tokens, at_once)
    finally:
        stop_daemon(process, endpoint)


def _pipeline_checkpoint(directory: Path) -> Path:
    """A tiny random deepseek_v3 (4 layers: MLA attention, a dense and three MoE MLPs; mlx-lm pipelines
    it) with the embedded model's tokenizer."""
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    from ..engine.architectures import ARCHITECTURES

    module_name, base = ARCHITECTURES["deepseek_v3"]
    config = dict(base, vocab_size=2048, num_hidden_layers=4, eos_token_id=[2, 0])
    module = importlib.import_module(f"mlx_lm.models.{module_name}")
    mx.random.seed(5)
    model = module.Model(module.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    directory.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(directory / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (directory / "config.json").write_text(json.dumps(config))
    embedded = ROOT / "models" / "mlxd-qwen3-tiny"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(embedded / name, directory / name)
    return directory


def test_distributed_without_a_group_is_refused():
    result = subprocess.run(
        [*MLXD, "-m", "embedded", "--distributed", "tensor", "--distributed-backend", "ring"],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )
    assert result.returncode == 2
    assert "mlx.launch" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_tensor_parallel_through_mlx_launch_equals_one_process():
    """The documented launch: outputs equal, status shows the group, ``mlxd stop`` ends every rank."""
    # every row may draft however many decode (the verify gate would keep a batch of 6 from drafting)
    args = ["-m", "embedded", "--max-kv-size", "4096", "--prompt-lookup-max-batch", "8"]
    expected = _single_process(args, PROMPTS + [LONG], 48)
    endpoint = private_endpoint("l")
    launch = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mlx.launch"),
            "--backend",
            "ring",
            "--hosts",
            "127.0.0.1,127.0.0.1",
            "--starting-port",
            str(_free_ports(1)[0]),
            *MLXD,
            "--endpoint",
            endpoint,
            "--distributed",
            "tensor",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        line = launch.stdout.readline()
        assert line.startswith("mlxd ready"), (line, launch.stderr.read()[-3000:] if launch.poll() is not None else "")
        assert _outputs(endpoint, PROMPTS + [LONG], 48) == expected
        copied = _done(endpoint, COPY, 48, True)
        assert copied.timings["draft_n_accepted"] > 0 and list(copied.tokens) == expected[(COPY, True)]
        status = subprocess.run(
            [*MLXD, "status", "--endpoint", endpoint, "--json"], capture_output=True, text=True, timeout=30, env=ENV
        )
        group = json.loads(status.stdout)["options"]["group"]
        assert (group["ranks"], group["mode"], group["lost"]) == (2, "tensor", None)
        text = subprocess.run(
            [*MLXD, "status", "--endpoint", endpoint], capture_output=True, text=True, timeout=30, env=ENV
        ).stdout
        assert "group: 2 ranks, tensor parallel" in text
        subprocess.run([*MLXD, "stop", "--endpoint", endpoint], check=True, capture_output=True, timeout=30, env=ENV)
        assert launch.wait(timeout=60) == 0
    finally:
        if launch.poll() is None:
            launch.kill()


@pytest.mark.slow
def test_pipeline_parallel_equals_one_process(tmp_path):
    model = str(_pipeline_checkpoint(tmp_path / "deepseek_v3"))
    args = ["-m", model, "--max-kv-size", "2048"]
    expected = _single_process(args, PROMPTS[:2], 40)
    group = Group(2, *args, "--distributed", "pipeline")
    try:
        assert _outputs(group.endpoint, PROMPTS[:2], 40) == expected
        with Client(group.endpoint, timeout_s=10.0) as client:
            client.shutdown()
        assert group.wait() == [0, 0]
    finally:
        group.kill()


@pytest.mark.slow
def test_a_model_without_the_mode_is_refused_naming_it():
    group = Group(2, "-m", "embedded", "--distributed", "pipeline", wait_ready=False)
    try:
        assert group.wait() == [2, 2]
        message = group.stderr(0)
        assert "model type 'qwen3' has no pipeline parallel" in message and "--distributed tensor" in message
        assert "Traceback" not in message
    finally:
        group.kill()


@pytest.mark.slow
@pytest.mark.skipif(not SMOLLM2.is_dir(), reason="SmolLM2-135M-Instruct is not present")
def test_smollm2_tensor_parallel_over_three_ranks_equals_one_process():
    """SmolLM2's 9 attention and 3 KV heads split over 3 ranks; over 2 they are refused naming the count."""
    refused = Group(2, "-m", str(SMOLLM2), "--distributed", "tensor", wait_ready=False)
    try:
        assert refused.wait(timeout_s=120) == [2, 2]
        assert "num_attention_heads=9 does not split over 2 ranks" in refused.stderr(0)
    finally:
        refused.kill()
    args = ["-m", str(SMOLLM2), "--max-kv-size", "1024"]
    prompts = ["Repeat exactly: The quick brown fox jumps over the lazy dog."]
    expected = _single_process(args, prompts, 12)
    group = Group(3, *args, "--distributed", "tensor")
    try:
        assert _outputs(group.endpoint, prompts, 12) == expected
        with Client(group.endpoint, timeout_s=10.0) as client:
            client.shutdown()
        assert group.wait() == [0, 0, 0]
    finally:
        group.kill()


@pytest.mark.slow
@pytest.mark.parametrize("killed", [1, 0])
def test_killing_a_rank_fails_the_requests_within_seconds(killed):
    group = Group(2, "-m", "embedded", "--max-kv-size", "8192", "--distributed", "tensor")
    errors: list = []

    def run(lookup):
        try:
            _generate(group.endpoint, "Write number 1 story", 6000, lookup)
        except DaemonError as error:
            errors.append((time.monotonic(), str(error)))

    threads = [threading.Thread(target=run, args=(lookup,), daemon=True) for lookup in (False, True)]
    try:
        for t in threads:
            t.start()
        time.sleep(2.0)  # both are decoding (6000 tokens take far longer)
        killed_at = time.monotonic()
        group.processes[killed].send_signal(signal.SIGKILL)
        survivor = group.processes[1 - killed]
        assert survivor.wait(timeout=10) == 1
        ended_after = time.monotonic() - killed_at
        assert ended_after < 5.0, ended_after
        if killed == 1:  # rank 0 answered every request with the reason before it exited
            for t in threads:
                t.join(timeout=10)
            assert len(errors) == 2, errors
            assert all(at - killed_at < 5.0 and "distributed group of 2 ranks lost" in text for at, text in errors), [
                (at - killed_at, text) for at, text in errors
            ]
            assert "Traceback" not in group.stderr(0)
    finally:
        group.kill()
