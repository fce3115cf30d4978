"""openblas_core: which kernel set to ask OpenBLAS for, and that a started process runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mlxd_fast_blas as fast_blas
from mlxd_fast_blas import openblas_core as core

AVX512 = {"sse3", "avx", "avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


def test_flags_come_from_the_first_cpu_line():
    info = "processor\t: 0\nflags\t\t: fpu sse3 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert core.cpu_flags(info) == {"fpu", "sse3", "avx", "avx2", "fma"}
    assert core.cpu_flags("Features\t: fp asimd\n") == set()  # arm64 Linux names no x86 flags


@pytest.mark.parametrize(
    ("flags", "tier"),
    [
        (AVX512, 3),
        (AVX512 - {"avx512vl"}, 2),  # an incomplete AVX-512 set is not SkylakeX's
        ({"avx", "avx2", "fma"}, 2),
        ({"avx", "avx2"}, 1),  # AVX2 without FMA: Haswell's kernels use both
        ({"avx"}, 1),
        ({"sse3"}, 0),
    ],
)
def test_cpu_tier_follows_the_widest_complete_set(flags, tier):
    assert core.cpu_tier(flags) == tier


def test_a_generic_pick_is_replaced_by_what_the_cpu_runs():
    assert core.core_to_force("Prescott", AVX512) == "SkylakeX"
    assert core.core_to_force("Nehalem", {"avx", "avx2", "fma"}) == "Haswell"
    assert core.core_to_force("Sandybridge", AVX512) == "SkylakeX"
    assert core.core_to_force("Core2", {"avx"}) == "Sandybridge"


def test_a_known_pick_or_an_old_cpu_is_left_alone():
    assert core.core_to_force("Haswell", AVX512) is None  # the library knew the CPU (an AMD Zen 4, say)
    assert core.core_to_force("Zen", AVX512) is None
    assert core.core_to_force("SkylakeX", AVX512) is None
    assert core.core_to_force("Prescott", {"sse3"}) is None  # nothing better to run
    assert core.core_to_force("NEOVERSEN1", AVX512) is None  # another architecture's name


def test_the_users_choice_stands(monkeypatch):
    monkeypatch.setenv(core.CORE_ENV, "Haswell")
    assert core.forced_core(fast_blas.find_openblas() or "/nonexistent") is None
    monkeypatch.setenv(core.CORE_ENV, "")  # set but empty counts as unset
    monkeypatch.setattr(core, "cpu_flags", lambda: set())
    assert core.forced_core("/nonexistent") is None  # no usable flags: nothing is loaded or asked


@pytest.mark.integration  # starts a process
@pytest.mark.skipif(
    not sys.platform.startswith("linux") or fast_blas.find_openblas() is None, reason="needs a system OpenBLAS"
)
def test_a_process_started_with_the_printed_environment_runs_the_cpus_kernels(monkeypatch):
    """What `make test` and the benchmarks start processes with: the kernel set the library runs there is at
    least the tier this CPU reaches, or the library's own pick where that was already a known one."""
    monkeypatch.delenv(core.CORE_ENV, raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    printed = subprocess.run(
        [sys.executable, "-m", "mlxd_fast_blas", "--env"], capture_output=True, text=True, check=True
    ).stdout.split()
    environment = dict(word.split("=", 1) for word in printed)
    assert environment["LD_PRELOAD"] == fast_blas.find_openblas()
    own_pick = core.core_started_with({"LD_PRELOAD": environment["LD_PRELOAD"]})  # what the library picks by itself
    started = core.core_started_with(environment)
    own_tier, cpu_tier = core.core_tier(own_pick), core.cpu_tier(core.cpu_flags())
    if own_tier is not None and own_tier < 2 and cpu_tier > own_tier:  # a generic pick on a newer CPU
        assert core.core_tier(started) == cpu_tier, (own_pick, started)
    else:
        assert started == own_pick and core.CORE_ENV not in environment
    assert fast_blas.blas_in_use().startswith(("openblas", "bundled"))
