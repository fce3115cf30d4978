// Running one problem on the chosen kernel, its output columns shared over the pool's threads.
#pragma once

#include "kernel.h"

namespace mlxd_qmm {

// Rows up to which a product counts as decode's (few rows, bound by memory bandwidth).
constexpr int kFewRows = 8;

// The CPUs this process may use.
int available_cores();

// Threads the pool runs a problem of many rows on (MLXD_QMM_THREADS, else available_cores()).
int pool_threads();

// Threads for a problem of at most kFewRows rows (MLXD_QMM_THREADS, else one fewer than pool_threads()).
int few_rows_threads();

// y = x @ dequantize(w)^T for one problem (x already in split order for 4 bits).
void run_problem(const Problem& problem, const Isa& isa);

}  // namespace mlxd_qmm
