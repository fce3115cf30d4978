// Running one problem on the chosen kernel, its output columns shared over the pool's threads.
#pragma once

#include <functional>

#include "kernel.h"

namespace mlxd_qmm {

// The CPUs this process may use.
int available_cores();

// Threads the pool runs a problem on (MLXD_QMM_THREADS, else available_cores()); problems too small to
// pay for waking a worker run on the calling thread alone.
int pool_threads();

// job(0) .. job(parts - 1), shared over the pool's threads (the caller runs part 0).
void run_parts(int parts, const std::function<void(int)>& job);

// y = x @ dequantize(w)^T for one problem (x already in split order for 4 bits).
void run_problem(const Problem& problem, const Isa& isa);

}  // namespace mlxd_qmm
