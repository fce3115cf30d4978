#!/usr/bin/env bash
# make demo: the engine demo, then mlxd on the embedded model with prompt lookup, mlx-generate on a copy
# prompt and a plain prompt, a few scheduler ticks through mlx-inspect-tick, and a clean stop.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
DIR=$(mktemp -d /tmp/mlxd-demo-XXXXXX)
chmod 700 "$DIR"
EP="ipc://$DIR/mlxd.sock"
COPY="Repeat the following paragraph exactly: A lighthouse keeper wrote in his log every evening. He noted the direction of the wind, the colour of the sea and the ships that passed the point."
PLAIN="Explain how a bicycle works."

echo "== 1. engine: plain decode vs the shared verify round (they must be identical)"
$BIN/python scripts/demo.py

echo
echo "== 2. mlxd with prompt lookup on the embedded model"
$BIN/mlxd --endpoint "$EP" --draft-kind prompt-lookup --log-level warning > "$DIR/mlxd.out" &
DAEMON=$!
trap '$BIN/mlxd stop --endpoint "$EP" >/dev/null 2>&1 || kill $DAEMON 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do grep -q "mlxd ready" "$DIR/mlxd.out" 2>/dev/null && break; sleep 0.1; done
cat "$DIR/mlxd.out"
$BIN/mlxd status --endpoint "$EP"

$BIN/mlx-inspect-tick --endpoint "$EP" --count 12 --rows 12 --timeout 60 > "$DIR/ticks.txt" 2>&1 &
WATCH=$!
sleep 1

echo
echo "== 3. copy prompt, prompt lookup on"
$BIN/mlx-generate --endpoint "$EP" --no-autostart --max-tokens 120 "$COPY"
echo
echo "== 4. the same copy prompt, prompt lookup refused for this request"
$BIN/mlx-generate --endpoint "$EP" --no-autostart --no-prompt-lookup --max-tokens 120 "$COPY"
echo
echo "== 5. plain prompt"
$BIN/mlx-generate --endpoint "$EP" --no-autostart --max-tokens 60 "$PLAIN"

wait $WATCH || true
echo
echo "== 6. the first scheduler ticks of step 3, as mlx-inspect-tick shows them"
cat "$DIR/ticks.txt"

echo
echo "== 7. stop"
$BIN/mlxd stop --endpoint "$EP"
wait $DAEMON
trap - EXIT
rm -rf "$DIR"
