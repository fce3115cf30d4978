"""mlxd_fast_blas: where the fast path applies, and the thread count the environment fixes."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mlxd_fast_blas as fast_blas


@pytest.fixture
def clean_env(monkeypatch):
    for name in (fast_blas.THREADS_ENV, "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_no_thread_count_without_the_environment(clean_env):
    assert fast_blas.explicit_blas_threads() is None  # the daemon measures instead (step_tuning)


def test_thread_count_follows_the_environment(clean_env):
    clean_env.setenv("OPENBLAS_NUM_THREADS", "3")
    assert fast_blas.explicit_blas_threads() == 3
    clean_env.setenv(fast_blas.THREADS_ENV, "5")  # ours wins over the library's own variable
    assert fast_blas.explicit_blas_threads() == 5
    clean_env.setenv(fast_blas.THREADS_ENV, "many")  # unusable: warned about and skipped
    assert fast_blas.explicit_blas_threads() == 3


def test_disabled_fast_path_preloads_nothing(monkeypatch):
    monkeypatch.setenv(fast_blas.DISABLE_ENV, "0")
    assert fast_blas.preload_value() is None


@pytest.mark.integration  # starts a process
@pytest.mark.skipif(
    not sys.platform.startswith("linux") or fast_blas.find_openblas() is None, reason="needs a system OpenBLAS"
)
def test_thread_count_reaches_a_preloaded_openblas():
    code = (
        "import ctypes, mlxd_fast_blas as f; assert f.set_blas_threads(1); "
        "print(ctypes.CDLL(None).openblas_get_num_threads())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"LD_PRELOAD": fast_blas.find_openblas(), "OPENBLAS_NUM_THREADS": "2", "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip() == "1"
