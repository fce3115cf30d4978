// Running one problem on the chosen kernel, its output columns shared over the pool's threads.
#pragma once

#include "kernel.h"

namespace mlxd_qmm {

// Threads the pool runs a problem on (MLXD_QMM_THREADS, else the CPUs this process may use).
int pool_threads();

// y = x @ dequantize(w)^T for one problem (x already in split order for 4 bits).
void run_problem(const Problem& problem, const Isa& isa);

}  // namespace mlxd_qmm
