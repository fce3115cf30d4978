// Choosing a kernel for this CPU, the split order of x, and the threads that share the output columns.
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "dispatch.h"
#include "kernel.h"

namespace mlxd_qmm {

namespace {

bool cpu_has(const char* isa) {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (std::strcmp(isa, "avx512") == 0) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }
  if (std::strcmp(isa, "avx512vnni") == 0) return cpu_has("avx512") && __builtin_cpu_supports("avx512vnni");
  if (std::strcmp(isa, "avx2") == 0) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                                            __builtin_cpu_supports("f16c");
#else
  (void)isa;
#endif
  return false;
}

const char* portable_name() {
#if defined(__aarch64__)
  return "neon";
#elif defined(__x86_64__) || defined(_M_X64)
  return "sse2";
#else
  return "portable";
#endif
}

}  // namespace

const Isa& select_isa() {
  static const Isa chosen = [] {
    std::vector<Isa> usable;
#if defined(__x86_64__) || defined(_M_X64)
    if (cpu_has("avx512")) usable.push_back({"avx512", 16, kernel_avx512});
    if (cpu_has("avx2")) usable.push_back({"avx2", 8, kernel_avx2});
#endif
    usable.push_back({portable_name(), lanes_portable(), kernel_portable});
    const char* wanted = std::getenv("MLXD_QMM_ISA");
    if (wanted != nullptr && *wanted != '\0') {
      for (const Isa& isa : usable) {
        if (std::strcmp(isa.name, wanted) == 0) return isa;
      }
    }
    return usable.front();
  }();
  return chosen;
}

KernelFn int8_kernel() {
#if defined(__x86_64__) || defined(_M_X64)
  static const KernelFn chosen = cpu_has("avx512vnni") && std::strcmp(select_isa().name, "avx512") == 0
                                     ? kernel_vnni_int8 : nullptr;
  return chosen;
#else
  return nullptr;
#endif
}

#if defined(MLXD_HAVE_AMX) && defined(__linux__)
namespace {

// AMX-TILE, AMX-BF16, AVX512-VBMI and AVX512-BF16 in CPUID leaf 7, and Linux's grant of the tile state to
// this process (it may refuse: an old kernel, a hypervisor that hides the state, a signal stack too small).
bool amx_runs_here() {
  const char* wanted = std::getenv("MLXD_QMM_AMX");
  if (wanted != nullptr && std::strcmp(wanted, "0") == 0) return false;
  if (std::strcmp(select_isa().name, "avx512") != 0) return false;  // the AMX kernel's own vector code
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amx_bf16 = edx & (1u << 22), amx_tile = edx & (1u << 24), avx512_vbmi = ecx & (1u << 1);
  if (!amx_bf16 || !amx_tile || !avx512_vbmi) return false;
  if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) || !(eax & (1u << 5))) return false;  // AVX512-BF16
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

KernelFn amx_kernel() {
  static const KernelFn chosen = amx_runs_here() ? kernel_amx : nullptr;
  return chosen;
}
#else
KernelFn amx_kernel() {
  return nullptr;
}
#endif

namespace {

// One row's blocks of `block` elements, each rounded to int8 against its largest magnitude (the reference form of
// quantize_blocks_int8_avx512).
void quantize_blocks_int8(const float* src, int K, int block, bool split, int8_t* dst, float* lanes) {
  const int row_lanes = int8_padded_k(K) / 8;
  for (int b = 0; b < K; b += block) {
    float amax = 0.0f;
    for (int i = b; i < b + block && i < K; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float scale = amax / 127.0f;
    const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int i = b; i < b + block && i < K; ++i) {
      const int chunk = i / 128 * 128, j = i - chunk;
      dst[split ? chunk + (j & 1) * 64 + j / 2 : i] = static_cast<int8_t>(std::lrintf(src[i] * inverse));
    }
    for (int lane = b / 8; lane < (b + block) / 8 && lane < row_lanes; ++lane) lanes[lane] = scale;
  }
}

// Each group's float sum, left to right as one chain a group; the groups' chains interleaved, so that they
// run side by side instead of each waiting on its own additions (the same sums).
void group_sums(const float* src, int groups, int group_size, float* sums) {
  for (int g = 0; g < groups; ++g) sums[g] = 0.0f;
  for (int i = 0; i < group_size; ++i)
    for (int g = 0; g < groups; ++g) sums[g] += src[g * group_size + i];
}

}  // namespace

int int8_block() {
  static const int block = [] {
    const char* wanted = std::getenv("MLXD_INT8_BLOCK");
    if (wanted == nullptr) return 8;
    const int asked = std::atoi(wanted);
    return asked == 16 || asked == 32 ? asked : 8;  // what the Python side refuses with a message falls back here
  }();
  return block;
}

void quantize_rows_int8(const float* x, int M, int K, int group_size, int block, bool split, int8_t* q,
                        float* lane_scales, float* group_sums_out) {
  const int Kpad = int8_padded_k(K);
  const int groups = K / group_size;
  const int Gpad = int8_padded_groups(groups);
  void (*blocks)(const float*, int, int, bool, int8_t*, float*) = quantize_blocks_int8;
#if defined(__x86_64__) || defined(_M_X64)
  if (K % 8 == 0 && int8_kernel() != nullptr) blocks = quantize_blocks_int8_avx512;
#endif
  for (int m = 0; m < M; ++m) {
    const float* src = x + static_cast<int64_t>(m) * K;
    int8_t* dst = q + static_cast<int64_t>(m) * Kpad;
    float* lanes = lane_scales + static_cast<int64_t>(m) * (Kpad / 8);
    float* sums = group_sums_out + static_cast<int64_t>(m) * Gpad;
    std::memset(dst, 0, Kpad);
    std::memset(lanes, 0, sizeof(float) * (Kpad / 8));
    std::memset(sums, 0, sizeof(float) * Gpad);
    blocks(src, K, block, split, dst, lanes);
    group_sums(src, groups, group_size, sums);
  }
}

uint64_t next_x_version() {
  static std::atomic<uint64_t> counter{0};
  return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

#if defined(__x86_64__) || defined(_M_X64)
// split_rows for blocks of 32 with AVX-512: each block's evens and odds by two two-source permutes.
__attribute__((target("avx512f"))) static void split_rows_32_avx512(const float* x, float* out, int M, int K) {
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odds = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int m = 0; m < M; ++m) {
    const float* src = x + static_cast<int64_t>(m) * K;
    float* dst = out + static_cast<int64_t>(m) * K;
    for (int k0 = 0; k0 < K; k0 += 32) {
      const __m512 a = _mm512_loadu_ps(src + k0), b = _mm512_loadu_ps(src + k0 + 16);
      _mm512_storeu_ps(dst + k0, _mm512_permutex2var_ps(a, evens, b));
      _mm512_storeu_ps(dst + k0 + 16, _mm512_permutex2var_ps(a, odds, b));
    }
  }
}
#endif

void split_rows(const float* x, float* out, int M, int K, int block) {
#if defined(__x86_64__) || defined(_M_X64)
  static const bool avx512 = cpu_has("avx512");
  if (block == 32 && K % 32 == 0 && avx512) {
    split_rows_32_avx512(x, out, M, K);
    return;
  }
#endif
  const int half = block / 2;
  for (int m = 0; m < M; ++m) {
    const float* src = x + static_cast<int64_t>(m) * K;
    float* dst = out + static_cast<int64_t>(m) * K;
    for (int k0 = 0; k0 < K; k0 += block) {
      for (int i = 0; i < half; ++i) {
        dst[k0 + i] = src[k0 + 2 * i];
        dst[k0 + half + i] = src[k0 + 2 * i + 1];
      }
    }
  }
}

// MLXD_QMM_THREADS when it holds a count (1 to 256), else 0.
int requested_threads() {
  if (const char* env = std::getenv("MLXD_QMM_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) return std::min(n, 256);
  }
  return 0;
}

// How long an idle worker spins for the next product before it sleeps: MLXD_QMM_SPIN_US when it holds a
// count of microseconds (0 to 100000), else kSpinMicros. Short, because a worker spinning past the end of
// one forward's products takes the core the serving thread needs to build the next one
// (docs/benchmark_results/code_notes.md#kernel-threads).
constexpr int kSpinMicros = 20;
int spin_micros() {
  if (const char* env = std::getenv("MLXD_QMM_SPIN_US")) {
    char* end = nullptr;
    const long us = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && us >= 0 && us <= 100000) return static_cast<int>(us);
  }
  return kSpinMicros;
}

int available_cores() {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = std::max(1, CPU_COUNT(&set));
#endif
  return cores;
}

// A small pool whose threads claim tasks one at a time: the calling thread starts on them at once, and a
// worker that is asleep or descheduled (the serving thread, another process) holds back only a task it has
// already claimed, never a fixed share of the work. Workers spin for a short while after a job (the next
// product of a forward follows within microseconds), then sleep.
//
// claim_ holds, in one word, the job's generation (high 32 bits), its task count (next 16) and the next
// unclaimed task (low 16): a claim is one compare-and-swap of that word, so a thread decides "a task is
// left" and takes it on one snapshot. A late thread holding an older word fails its swap once the job has
// changed, and a task claimed below the count means the job is still running, so job_ is still its job.
// (With the count kept apart, a thread could read the next job's count beside the old word and "claim" a
// task that no longer existed, counting it done for the next job while that job's tasks still ran.)
class Pool {
 public:
  static Pool& instance() {
    static Pool* pool = new Pool();  // never destroyed: workers may still be asleep at exit
    return *pool;
  }

  int threads() const {
    return static_cast<int>(workers_.size()) + 1;
  }

  void run(int tasks, const std::function<void(int)>& job) {
    if (tasks <= 1 || workers_.empty()) {
      for (int i = 0; i < tasks; ++i) job(i);
      return;
    }
    std::lock_guard<std::mutex> one_caller(run_mutex_);
    job_.store(&job, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t generation = (generation_of(claim_.load(std::memory_order_relaxed)) + 1) & 0xffffffffu;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      claim_.store(generation << 32 | static_cast<uint64_t>(tasks) << 16, std::memory_order_release);
    }
    if (sleepers_.load(std::memory_order_acquire) > 0) wake_.notify_all();
    work_on(generation);
    while (done_.load(std::memory_order_acquire) < tasks) pause();
  }

 private:
  Pool() {
    int count = configured_threads();
    for (int i = 1; i < count; ++i) workers_.emplace_back([this] { work(); });
    for (auto& worker : workers_) worker.detach();
  }

  static int configured_threads() {
    const int wanted = requested_threads();
    return wanted > 0 ? wanted : available_cores();
  }

  static void pause() {
#if defined(__x86_64__) || defined(_M_X64)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  static uint64_t generation_of(uint64_t claim) {
    return claim >> 32;
  }

  // Runs the tasks of job `generation` this thread can claim, until none is left or a newer job began.
  void work_on(uint64_t generation) {
    for (;;) {
      uint64_t claim = claim_.load(std::memory_order_acquire);
      if (generation_of(claim) != generation) return;
      const int task = static_cast<int>(claim & 0xffffu);
      if (task >= static_cast<int>((claim >> 16) & 0xffffu)) return;
      if (!claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel)) continue;
      (*job_.load(std::memory_order_relaxed))(task);
      done_.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  void work() {
    uint64_t seen = 0;
    for (;;) {
      auto start = std::chrono::steady_clock::now();
      int spins = 0;
      while (generation_of(claim_.load(std::memory_order_acquire)) == seen) {
        pause();
        if (++spins % 256 == 0 &&
            std::chrono::steady_clock::now() - start > std::chrono::microseconds(spin_micros_)) {
          std::unique_lock<std::mutex> lock(mutex_);
          sleepers_.fetch_add(1, std::memory_order_acq_rel);
          wake_.wait(lock, [&] { return generation_of(claim_.load(std::memory_order_acquire)) != seen; });
          sleepers_.fetch_sub(1, std::memory_order_acq_rel);
          break;
        }
      }
      seen = generation_of(claim_.load(std::memory_order_acquire));
      work_on(seen);
    }
  }

  const int spin_micros_ = spin_micros();
  std::vector<std::thread> workers_;
  std::mutex run_mutex_, mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> claim_{0};
  std::atomic<int> done_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<const std::function<void(int)>*> job_{nullptr};
};

int pool_threads() {
  return Pool::instance().threads();
}

void run_tasks(int tasks, const std::function<void(int)>& job) {
  constexpr int kMostTasks = 0xffff;  // what a job's count field holds
  for (int first = 0; first < tasks; first += kMostTasks) {
    const int count = std::min(kMostTasks, tasks - first);
    if (first == 0 && count == tasks) {
      Pool::instance().run(tasks, job);
    } else {
      Pool::instance().run(count, [&](int task) { job(first + task); });
    }
  }
}

// Tasks [0, tasks) cut into `runs` runs of adjacent tasks, one a thread: a thread takes its run's tasks
// from the front, in order, then the tasks left at the back of the others' runs, so the columns a thread
// works on follow each other (its kernel asks for the next ones' weights while it works on these: a task
// that starts on columns no one asked for waits on memory, code_notes.md#adjacent-tasks), and a thread that
// falls behind still holds back only the task it is on. Each run is one word, its next task (low 32 bits)
// and its end (high 32): taking from either end is one compare-and-swap, so the front and the back never
// hand out the same task.
namespace {
void run_runs(int tasks, int runs, const std::function<void(int)>& job) {
  runs = std::max(1, std::min(runs, tasks));
  struct alignas(64) Span {  // a cache line each: each thread's claims stay on its own line
    std::atomic<uint64_t> word;
  };
  std::vector<Span> spans(runs);
  for (int r = 0; r < runs; ++r) {
    const uint64_t begin = static_cast<uint64_t>(tasks) * r / runs, end = static_cast<uint64_t>(tasks) * (r + 1) / runs;
    spans[r].word.store(end << 32 | begin, std::memory_order_relaxed);
  }
  auto take = [&](int r, bool front) {  // a task of run r, or -1 when it has none left
    uint64_t span = spans[r].word.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t next = span & 0xffffffffu, end = span >> 32;
      if (next >= end) return -1;
      const uint64_t taken = front ? (end << 32 | (next + 1)) : ((end - 1) << 32 | next);
      if (spans[r].word.compare_exchange_weak(span, taken, std::memory_order_acq_rel)) {
        return static_cast<int>(front ? next : end - 1);
      }
    }
  };
  run_tasks(runs, [&](int own) {
    for (int t; (t = take(own, true)) >= 0;) job(t);
    for (int step = 1; step < runs; ++step) {
      for (int t; (t = take((own + step) % runs, false)) >= 0;) job(t);
    }
  });
}
}  // namespace

// Columns per task: about kTasksPerThread tasks for each thread, whole tiles of 8 columns, at least
// kMinTaskColumns, so a thread that falls behind leaves little for the others to wait on.
constexpr int kTasksPerThread = 8;
constexpr int kMinTaskColumns = 32;

void run_problems(const std::vector<Problem>& problems, const Isa& isa) {
  // Small products stay on one thread: waking a worker costs more than it saves.
  int64_t work = 0;
  int columns_in_all = 0;
  for (const Problem& p : problems) {
    work += static_cast<int64_t>(p.N) * p.K * p.bits / 8 * (1 + p.M / 4);
    columns_in_all += p.N;
  }
  const int threads = pool_threads();
  if (work < (1 << 16) || threads == 1 || columns_in_all < 2 * kMinTaskColumns) {
    for (const Problem& p : problems) {
      if (p.M > 0 && p.N > 0) isa.kernel(p, 0, p.N);
    }
    return;
  }
  const int wanted = (columns_in_all + threads * kTasksPerThread - 1) / (threads * kTasksPerThread);
  // whole tiles: AMX takes 2 x 16 columns at once, column-block weights come in blocks of 16
  const int unit = problems.front().amx != nullptr ? 32 : problems.front().columns ? 16 : 8;
  const int columns = (std::max(wanted, kMinTaskColumns) + unit - 1) / unit * unit;
  struct Task {
    int problem, n0, n1;
  };
  std::vector<Task> tasks;
  for (int i = 0; i < static_cast<int>(problems.size()); ++i) {
    if (problems[i].M == 0) continue;
    for (int n0 = 0; n0 < problems[i].N; n0 += columns) tasks.push_back({i, n0, std::min(problems[i].N, n0 + columns)});
  }
  run_runs(static_cast<int>(tasks.size()), threads, [&](int t) {
    const Task& task = tasks[t];
    isa.kernel(problems[task.problem], task.n0, task.n1);
  });
}


}  // namespace mlxd_qmm
