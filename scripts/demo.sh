#!/usr/bin/env bash
# make demo: mlxd on the default model (SmolLM2-135M-Instruct; the embedded tiny model where it cannot be
# had), a plain chat question, a copy prompt with prompt lookup on and off (speed of each, and whether the
# replies are identical), the first scheduler ticks of the copy request through mlx-inspect-tick, a clean stop.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
DIR=$(mktemp -d /tmp/mlxd-demo-XXXXXX)
chmod 700 "$DIR"
EP="ipc://$DIR/mlxd.sock"
PLAIN="What is the capital of France, and what is it famous for?"
COPY="Repeat the following paragraph exactly: A lighthouse keeper wrote in his log every evening. He noted the direction of the wind, the colour of the sea and the ships that passed the point."

echo "== 1. mlxd on the default model"
$BIN/mlxd --endpoint "$EP" --log-level info > "$DIR/mlxd.out" 2> "$DIR/mlxd.err" &
DAEMON=$!
trap '$BIN/mlxd stop --endpoint "$EP" >/dev/null 2>&1 || kill $DAEMON 2>/dev/null || true' EXIT
for _ in $(seq 1 1800); do
    grep -q "mlxd ready" "$DIR/mlxd.out" 2>/dev/null && break
    kill -0 $DAEMON 2>/dev/null || { cat "$DIR/mlxd.err"; exit 1; }
    sleep 0.1
done
grep -E "default model|weights:|blas_threads" "$DIR/mlxd.err" | sed -E 's/^[0-9-]+ [0-9:,]+ //; s/ (max_batch|lookahead|speculative|prompt_lookup_max_batch|storage)=.*(blas=)/ \2/'
cat "$DIR/mlxd.out"

echo
echo "== 2. a plain chat question: $PLAIN"
$BIN/mlx-generate --endpoint "$EP" --no-autostart --max-tokens 96 "$PLAIN"

$BIN/mlx-inspect-tick --endpoint "$EP" --count 12 --rows 12 --timeout 120 > "$DIR/ticks.txt" 2>&1 &
WATCH=$!
sleep 1

echo
echo "== 3. a copy prompt, prompt lookup on"
$BIN/mlx-generate --endpoint "$EP" --no-autostart --prompt-lookup --max-tokens 80 --json "$COPY" > "$DIR/on.json"
echo "== 4. the same copy prompt, prompt lookup off"
$BIN/mlx-generate --endpoint "$EP" --no-autostart --no-prompt-lookup --max-tokens 80 --json "$COPY" > "$DIR/off.json"
$BIN/python scripts/demo_summary.py "$DIR/on.json" "$DIR/off.json"

wait $WATCH || true
echo
echo "== 5. the first scheduler ticks of step 3, as mlx-inspect-tick shows them"
cat "$DIR/ticks.txt"

echo
echo "== 6. stop"
$BIN/mlxd stop --endpoint "$EP"
wait $DAEMON
trap - EXIT
rm -rf "$DIR"
