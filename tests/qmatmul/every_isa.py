"""The kernel's results on every instruction set this CPU runs, each in its own process (the ISA is chosen once
per process: MLXD_QMM_ISA forces a narrower one, MLXD_QMM_AMX=0 turns the AMX kernel off)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import mlxd_qmatmul

CHOICES = (("avx512", "1"), ("avx512", "0"), ("avx2", "1"), ("sse2", "1"), ("neon", "1"))


def results_on_every_isa(script: str, tmp_path: Path) -> dict[str, np.ndarray]:
    """Runs ``script`` (it prints ``q.kernel_isa()`` plus "+amx" where AMX runs, and saves its result with
    ``np.save(sys.argv[1], ...)``) under every choice; returns the results by the path that ran. Checks that at
    least the chosen path and the portable one ran, and AMX beside AVX-512 where the CPU has it."""
    results = {}
    for isa, amx in CHOICES:
        path = tmp_path / f"{isa}-{amx}.npy"
        done = subprocess.run(
            [sys.executable, "-c", "import sys\n" + script, str(path)],
            capture_output=True,
            text=True,
            env={**os.environ, "MLXD_QMM_ISA": isa, "MLXD_QMM_AMX": amx},
            check=True,
        )
        results[done.stdout.strip()] = np.load(path)
    assert len(results) >= 2
    if mlxd_qmatmul.amx_available():
        assert {"avx512+amx", "avx512"} <= set(results)
    return results
