"""The extension built by a compiler without AMX (an arm64 build, an older GCC or Clang) loads and runs the
vector kernels: no AMX symbol is left unresolved in the module. Built here with the compiler check forced
off, into a temporary directory, unoptimized (a Debug build at -O0: the same sources and instruction-set flags
in about half the compile time; the optimized build is `make setup`'s, which every other kernel test uses)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "packages" / "mlxd_qmatmul" / "native"

pytestmark = [
    pytest.mark.slow,  # a whole build of the extension: about 25 s on 2 cores
    pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("nm") is None, reason="needs cmake and nm"),
]


def test_a_build_without_amx_loads_and_agrees_with_mlx(tmp_path):
    build = tmp_path / "build"
    configure = [
        "cmake", "-S", str(NATIVE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Debug",
        "-DCMAKE_CXX_FLAGS_DEBUG=-O0", "-DMLXD_COMPILER_HAS_AMX=OFF", f"-DPython_EXECUTABLE={sys.executable}",
    ]  # fmt: skip
    done = subprocess.run(configure, capture_output=True, text=True)
    if done.returncode != 0 and "nanobind" in done.stderr.lower():
        pytest.skip("nanobind is not installed (make setup installs it)")
    assert done.returncode == 0, done.stderr
    compile_it = ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", "_ext"]
    done = subprocess.run(compile_it, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (module,) = build.glob("_ext*.so")
    undefined = subprocess.run(["nm", "-D", "-C", "--undefined-only", str(module)], capture_output=True, text=True)
    assert [line for line in undefined.stdout.splitlines() if "mlxd_qmm" in line] == []

    package = tmp_path / "site" / "mlxd_qmatmul"
    package.mkdir(parents=True)
    shutil.copy(ROOT / "packages" / "mlxd_qmatmul" / "__init__.py", package)
    shutil.copy(module, package)
    script = (
        "import mlx.core as mx, numpy as np, mlxd_qmatmul as q\n"
        f"assert q.__file__.startswith({str(package)!r}), q.__file__\n"
        "assert q.available(), q.unavailable_reason()\n"
        "assert not q.amx_available()\n"
        "w = mx.random.normal((256, 512), key=mx.random.key(1))\n"
        "wq, s, b = mx.quantize(w, group_size=64, bits=4)\n"
        "for rows in (1, 9, 40):\n"
        "    x = mx.random.normal((rows, 512), key=mx.random.key(rows))\n"
        "    got = np.array(q.quantized_matmul(x, wq, s, b, 64, 4))\n"
        "    want = np.array(mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64, bits=4))\n"
        "    assert np.abs(got - want).max() <= 1e-3 * (np.abs(want).max() + 1), rows\n"
        "print(q.kernel_isa())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
