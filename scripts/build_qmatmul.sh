#!/usr/bin/env bash
# Builds mlxd's CPU quantized-matmul extension (packages/mlxd_qmatmul/native) against the installed mlx,
# with cmake, a C++ compiler and nanobind (installed into the venv from PyPI), and puts the module beside
# packages/mlxd_qmatmul/__init__.py. A failed build is not a failed set-up: mlxd then logs that it runs
# without the kernel and keeps its float32 weight rule. Usage: scripts/build_qmatmul.sh [PYTHON]
set -uo pipefail
PY=${1:-.venv/bin/python}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SRC=$ROOT/packages/mlxd_qmatmul/native
BUILD=$ROOT/build/qmatmul
fail() { echo "CPU quantized-matmul kernel not built ($1): mlxd runs without it (float32 weights on the CPU)"; exit 0; }
command -v cmake >/dev/null || fail "no cmake"
command -v c++ >/dev/null || command -v g++ >/dev/null || command -v clang++ >/dev/null || fail "no C++ compiler"
"$PY" -m pip install --quiet "nanobind>=2.9" >/dev/null 2>&1 || fail "cannot install nanobind"
mkdir -p "$BUILD"
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$("$PY" -c 'import sys; print(sys.executable)')" \
  >"$BUILD/configure.log" 2>&1 || fail "cmake configure failed, see $BUILD/configure.log"
cmake --build "$BUILD" -j"$(nproc 2>/dev/null || echo 2)" >"$BUILD/build.log" 2>&1 || fail "compile failed, see $BUILD/build.log"
cp "$BUILD"/_ext*.so "$ROOT/packages/mlxd_qmatmul/" || fail "no module produced"
"$PY" -c 'import mlxd_qmatmul as q; assert q.available(), q.unavailable_reason(); amx = " + AMX (6 rows or more, 8 for 8-bit weights)" if q.amx_available() else ""; print(f"CPU quantized-matmul kernel: {q.kernel_isa()}{amx}, {q.describe_threads()}")' \
  || fail "the built module does not load"
