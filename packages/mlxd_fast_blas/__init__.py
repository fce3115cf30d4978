"""Fast BLAS for MLX on Linux CPU: find a system OpenBLAS and re-exec with it preloaded.

Why: the Linux mlx[cpu] wheel bundles a reference BLAS, far slower at float32 matmul than a system
OpenBLAS (Debian's libopenblas0-pthread, say); with one preloaded, MLX's CPU backend resolves its cblas_*
calls to it (docs/benchmark_results/code_notes.md#fast-blas).

Contract: ``ensure_fast_blas()`` is called first thing by every entry point that imports mlx. On Linux,
unless ``MLXD_FAST_BLAS=0``, it looks for an OpenBLAS (``MLXD_OPENBLAS`` names one explicitly) and, if
it is not already preloaded, re-executes the process with it in ``LD_PRELOAD``, and with
``OPENBLAS_CORETYPE`` where the library does not know this CPU and would run generic kernels
(``openblas_core``). It never imports mlx. ``blas_in_use()`` says what the running process has mapped and
which kernels it runs, for the log line at start-up. ``python -m mlxd_fast_blas`` prints the
``LD_PRELOAD`` value, and with ``--env`` both assignments, for a process started from a shell or a Makefile.

A server chooses its OpenBLAS thread count by timing the loaded model (``mlxd_daemon.step_tuning``);
``explicit_blas_threads()`` is the count the environment fixes instead (``MLXD_BLAS_THREADS``, else
``OPENBLAS_NUM_THREADS``), and ``set_blas_threads()`` sets it in the running process.
This module is a leaf: standard library only.
"""

from __future__ import annotations

import ctypes.util
import logging
import os
import sys
from pathlib import Path

from mlxd_fast_blas.openblas_core import CORE_ENV, forced_core, loaded_core

DISABLE_ENV = "MLXD_FAST_BLAS"
THREADS_ENV = "MLXD_BLAS_THREADS"
LIBRARY_ENV = "MLXD_OPENBLAS"
_REEXEC_MARK = "MLXD_FAST_BLAS_REEXEC"

_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
    "/usr/local/lib/libopenblas.so.0",
)

log = logging.getLogger("mlxd.blas")


def find_openblas() -> str | None:
    """Path of a usable OpenBLAS shared library, or None."""
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        return explicit if Path(explicit).is_file() else None
    for candidate in _CANDIDATES:
        if Path(candidate).is_file():
            return candidate
    found = ctypes.util.find_library("openblas")
    if found:
        for directory in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"):
            if Path(directory, found).is_file():
                return str(Path(directory, found))
    return None


def preload_value() -> str | None:
    """The LD_PRELOAD value that enables the fast path here, or None when it does not apply."""
    if not sys.platform.startswith("linux") or os.environ.get(DISABLE_ENV) == "0":
        return None
    library = find_openblas()
    if library is None:
        return None
    current = os.environ.get("LD_PRELOAD", "")
    if library in current.split(":"):
        return current
    return f"{library}:{current}" if current else library


def preload_environment() -> dict[str, str]:
    """The variables that enable the fast path for a process started now: ``LD_PRELOAD``, and
    ``OPENBLAS_CORETYPE`` where the library would not pick this CPU's kernels (empty where nothing applies)."""
    value = preload_value()
    if value is None:
        return {}
    environment = {"LD_PRELOAD": value}
    library = find_openblas()
    core = forced_core(library) if library else None
    if core is not None:
        environment[CORE_ENV] = core
    return environment


def ensure_fast_blas() -> None:
    """Re-exec the current process with OpenBLAS preloaded (and its kernels chosen, where the library does
    not know this CPU) when that applies and is not done yet."""
    if os.environ.get(_REEXEC_MARK):
        return  # already re-executed once: never loop
    value = preload_value()
    if value is None:
        return
    if value != os.environ.get("LD_PRELOAD"):
        wanted = preload_environment()
    else:  # preloaded by whoever started us: only the kernels may be missing
        core = forced_core(None)
        wanted = {CORE_ENV: core} if core is not None else {}
    if not wanted:
        return
    os.environ.update(wanted)
    os.environ[_REEXEC_MARK] = "1"
    argv = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    try:
        os.execv(sys.executable, [sys.executable, *argv[1:]])
    except OSError as error:  # keep running on the bundled BLAS rather than fail
        log.warning("could not re-exec with %s preloaded: %s", value, error)


def explicit_blas_threads() -> int | None:
    """OpenBLAS threads the environment asks for (``MLXD_BLAS_THREADS``, else ``OPENBLAS_NUM_THREADS``), or None."""
    for name in (THREADS_ENV, "OPENBLAS_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return max(1, int(value))
            except ValueError:
                log.warning("ignoring %s=%r: not a whole number", name, value)
    return None


def set_blas_threads(threads: int) -> bool:
    """Set OpenBLAS's thread count in this process (True when an OpenBLAS is loaded and took it)."""
    try:
        setter = ctypes.CDLL(None).openblas_set_num_threads
    except (AttributeError, OSError):
        return False
    setter.argtypes = [ctypes.c_int]
    setter.restype = None
    setter(int(threads))
    return True


def blas_in_use() -> str:
    """What BLAS this process has loaded: 'openblas (<path>)', the platform's, or the bundled one."""
    if sys.platform == "darwin":
        return "Accelerate (macOS)"
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    for line in maps.splitlines():
        if "libopenblas" in line:
            return f"openblas ({line.split()[-1]}{_kernels_note()})"
    return "bundled reference BLAS (slow; install libopenblas0-pthread or set MLXD_OPENBLAS)"


def _kernels_note() -> str:
    """', <kernel set> kernels' of the loaded OpenBLAS, naming OPENBLAS_CORETYPE when that chose them."""
    try:
        core = loaded_core(ctypes.CDLL(None))
    except OSError:
        core = None
    if core is None:
        return ""
    return f", {core} kernels" + (f" ({CORE_ENV})" if os.environ.get(CORE_ENV, "").strip() else "")


def main() -> None:
    """``python -m mlxd_fast_blas``: print the LD_PRELOAD value for the fast path (empty if none); with
    ``--env``, every variable it needs as NAME=value words (for ``env $(python -m mlxd_fast_blas --env) ...``)."""
    if "--env" in sys.argv[1:]:
        print(" ".join(f"{name}={value}" for name, value in preload_environment().items()))
    else:
        print(preload_value() or "")


if __name__ == "__main__":
    main()
