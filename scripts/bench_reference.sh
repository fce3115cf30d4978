#!/usr/bin/env bash
# The project's reference serving comparison on one model (MODEL; default the embedded one), side by side in one run:
#   off     mlx-serve-http (its own mlxd, prompt lookup off)
#   on      mlx-serve-http (its own mlxd, --draft-kind prompt-lookup)
#   mlx_lm  mlx_lm.server on the same model, made fair: the same OpenBLAS preload as mlxd on Linux CPU, and a
#           copy of the checkpoint with mlxd's CPU weight rule applied (float32, dequantized; written by
#           scripts/write_cpu_weights_copy.py), since mlx_lm.server would compute in float16 on the CPU
# plain and copy prompts (extra arguments go to mlx-bench: --prompt-style copy runs copy only), concurrency
# 1,4,8, 3 interleaved rounds; ratios vs "off".
# Written to docs/benchmark_results/reference/ (results.md, results.json, PNG plots, server logs).
# Sized to finish in under 20 minutes on 2 CPU cores; override with the environment variables below.
#
# Each mlx-serve-http gets a private MLXD_ENDPOINT in its own 0700 directory, so the two gateways do not
# share a daemon. A gateway autostarts its daemon, and that daemon outlives the gateway: the trap below
# stops both daemons with `mlxd stop` however the run ends.
#
# Run: bash scripts/bench_reference.sh        (needs `make setup`)
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-.venv/bin}
MODEL=${MODEL:-models/mlxd-qwen3-tiny}
OUT=${OUT:-docs/benchmark_results/reference}
ROUNDS=${ROUNDS:-3}
CONCURRENCY=${CONCURRENCY:-1,4,8}
MAX_TOKENS=${MAX_TOKENS:-128}
PROMPT_TOKENS=${PROMPT_TOKENS:-120}
ROOT=$(pwd)
PY="$ROOT/$BIN/python"

# Private socket directories, created 0700 before any daemon looks at them (mktemp -d makes them 0700).
umask 077
ON_DIR=$(mktemp -d /tmp/mlxd-bench-on-XXXXXX)
OFF_DIR=$(mktemp -d /tmp/mlxd-bench-off-XXXXXX)
chmod 700 "$ON_DIR" "$OFF_DIR"
ON_EP="ipc://$ON_DIR/d.sock"
OFF_EP="ipc://$OFF_DIR/d.sock"

stop_daemon() {  # NAME ENDPOINT DIRECTORY: stop the daemon, keep its log, remove its directory
    "$BIN/mlxd" stop --endpoint "$2" >/dev/null 2>&1 || true
    for log in "$3"/*.log; do
        if [ -f "$log" ]; then cp "$log" "$OUT/daemon-$1.log" || true; fi
    done
    rm -rf "$3"
}
stop_daemons() {
    mkdir -p "$OUT" || true
    stop_daemon on "$ON_EP" "$ON_DIR"
    stop_daemon off "$OFF_EP" "$OFF_DIR"
}
trap stop_daemons EXIT

# mlxd re-executes itself with OpenBLAS preloaded on Linux CPU (and its kernels chosen where the library does
# not know the CPU); give mlx_lm.server the same BLAS.
BLAS_ENV=$("$PY" -m mlxd_fast_blas --env 2>/dev/null || true)
umask 022
mkdir -p "$OUT"

# mlx_lm.server's copy of the model with the CPU weight rule applied (removed at exit with the socket folders).
MLX_LM_DIR=$(mktemp -d /tmp/mlxd-bench-mlx-lm-XXXXXX)
trap 'stop_daemons; rm -rf "$MLX_LM_DIR"' EXIT
"$PY" scripts/write_cpu_weights_copy.py "$MODEL" "$MLX_LM_DIR/model"

# mlx-bench once the console script is installed (make setup), else the module.
if [ -x "$BIN/mlx-bench" ]; then BENCH=("$BIN/mlx-bench"); else BENCH=("$PY" -m mlxd_cli.bench.main); fi
# plain and copy prompts unless the caller names its own styles (mlx-bench adds up repeated --prompt-style)
STYLE_ARGS=(--prompt-style plain,copy)
for arg in "$@"; do
    if [ "$arg" = "--prompt-style" ]; then STYLE_ARGS=(); fi
done

"${BENCH[@]}" \
    --serve "off=env MLXD_ENDPOINT=$OFF_EP '$ROOT/$BIN/mlx-serve-http' --port {port} -m '$MODEL'" \
    --serve "on=env MLXD_ENDPOINT=$ON_EP '$ROOT/$BIN/mlx-serve-http' --port {port} -m '$MODEL' --draft-kind prompt-lookup" \
    --serve "mlx_lm=env $BLAS_ENV '$PY' -m mlx_lm server --model '$MLX_LM_DIR/model' --port {port}" \
    --target-model mlx_lm=default_model \
    --baseline off \
    "${STYLE_ARGS[@]}" \
    --concurrency "$CONCURRENCY" \
    --rounds "$ROUNDS" \
    --max-tokens "$MAX_TOKENS" \
    --prompt-tokens "$PROMPT_TOKENS" \
    --warmup 1 \
    --seed 0 \
    --temperature 0 \
    --serve-timeout 300 \
    --out "$OUT" \
    "$@"
