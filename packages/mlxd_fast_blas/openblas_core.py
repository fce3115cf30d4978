"""Which of OpenBLAS's kernel sets runs, and the one to ask for when the library does not know this CPU.

A DYNAMIC_ARCH OpenBLAS (Debian's is one) picks its kernels from the CPU's family and model number. A CPU
newer than the library (Debian 12's 0.3.21 on a 5th-generation Xeon, model 207, say) falls back to a
generic SSE3 set ("Prescott"), and float32 matmul then runs 3-5x slower than the AVX-512 kernels the same
library holds (docs/benchmark_results/code_notes.md#openblas-core). OpenBLAS reads ``OPENBLAS_CORETYPE`` at
load to choose instead; ``forced_core`` names the set to ask for from the instruction sets the CPU reports,
only where the library's own pick is such a generic one and the user has not set the variable.
Standard library only: it runs before mlx is imported.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

CORE_ENV = "OPENBLAS_CORETYPE"

# OpenBLAS's names for its x86-64 kernel sets, by the widest vector instructions they use: 0 SSE only, 1 AVX,
# 2 AVX2 and FMA, 3 AVX-512. A name not listed (another architecture's) counts as known and is left alone.
_TIERS = {
    **dict.fromkeys(
        (
            "unknown",
            "katmai",
            "coppermine",
            "northwood",
            "prescott",
            "banias",
            "atom",
            "core2",
            "penryn",
            "dunnington",
            "nehalem",
            "athlon",
            "opteron",
            "opteron(sse3)",
            "barcelona",
            "nano",
            "bobcat",
        ),
        0,
    ),
    **dict.fromkeys(("sandybridge", "bulldozer", "piledriver", "steamroller", "excavator"), 1),
    **dict.fromkeys(("haswell", "zen"), 2),
    **dict.fromkeys(("skylakex", "cooperlake", "sapphirerapids"), 3),
}
# The set to ask for at each tier the CPU reaches (the most widely shipped name of that tier).
_CORE_FOR_TIER = {1: "Sandybridge", 2: "Haswell", 3: "SkylakeX"}
_AVX512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The instruction-set flags Linux reports for the first CPU (empty where it reports none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return set(value.split())
    return set()


def cpu_tier(flags: set[str]) -> int:
    """The widest kernel tier this CPU (and the OS, which drops the flags of state it does not save) runs."""
    if _AVX512 <= flags:
        return 3
    if {"avx2", "fma"} <= flags:
        return 2
    return 1 if "avx" in flags else 0


def core_tier(core: str) -> int | None:
    """The tier of one of OpenBLAS's kernel-set names, None for a name outside the x86-64 list."""
    return _TIERS.get(core.strip().lower())


def core_to_force(detected: str, flags: set[str]) -> str | None:
    """The kernel set to ask for instead of ``detected`` (OpenBLAS's own pick), or None to keep it: only a
    generic pick (SSE or AVX only) below what the CPU runs is replaced; a known CPU's pick is kept."""
    tier = core_tier(detected)
    if tier is None or tier >= 2:
        return None
    wanted = cpu_tier(flags)
    return _CORE_FOR_TIER[wanted] if wanted > tier else None


def loaded_core(library: ctypes.CDLL) -> str | None:
    """The kernel set a loaded OpenBLAS runs (``openblas_get_corename``), None where it cannot say."""
    try:
        get = library.openblas_get_corename
    except AttributeError:
        return None
    get.restype = ctypes.c_char_p
    name = get()
    return name.decode(errors="replace") if name else None


def forced_core(library_path: str | None) -> str | None:
    """The ``OPENBLAS_CORETYPE`` to start a process with so that the OpenBLAS at ``library_path`` (None: the
    one this process has loaded) runs the kernels this CPU can: None when the user set the variable, the
    library picks well, or it cannot load. Loads the library into this process to ask it (call it only
    before re-executing, or in a short-lived process)."""
    if os.environ.get(CORE_ENV, "").strip():
        return None
    flags = cpu_flags()
    if cpu_tier(flags) < 1:
        return None
    try:
        detected = loaded_core(ctypes.CDLL(library_path))
    except OSError:
        return None
    return None if detected is None else core_to_force(detected, flags)


def core_started_with(environment: dict[str, str]) -> str:
    """The kernel set OpenBLAS runs in a Python process started with ``environment`` added to this one's
    (without its ``OPENBLAS_CORETYPE`` unless ``environment`` names one): for benchmarks and tests."""
    code = "import ctypes; from mlxd_fast_blas.openblas_core import loaded_core; print(loaded_core(ctypes.CDLL(None)))"
    env = {key: value for key, value in os.environ.items() if key != CORE_ENV}
    env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**env, **environment}
    ).stdout.strip()
