// Running one problem on the chosen kernel, its output columns shared over the pool's threads.
#pragma once

#include <functional>
#include <vector>

#include "kernel.h"

namespace mlxd_qmm {

// The CPUs this process may use.
int available_cores();

// Threads the pool runs a problem on (MLXD_QMM_THREADS, else available_cores()); problems too small to
// pay for waking a worker run on the calling thread alone.
int pool_threads();

// job(0) .. job(tasks - 1), each run once by whichever of the pool's threads claims it (the caller
// among them); returns when all have run.
void run_tasks(int tasks, const std::function<void(int)>& job);

// y = x @ dequantize(w)^T for each problem over the same x (x already in split order for 4 bits; several
// problems: the parts of one packed weight), their columns shared over the pool as one job.
void run_problems(const std::vector<Problem>& problems, const Isa& isa);

}  // namespace mlxd_qmm
