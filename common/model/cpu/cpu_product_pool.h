// Helper threads that take parts of a model thread's few-row products.
//
// A decode step, a verify block or a drafter block multiplies 1-32 rows by
// each weight matrix. OpenBLAS runs such a product on its small-matrix
// kernel, on one thread whatever its thread count, so a second core sat
// idle through a forward's products, which run much faster as column halves on
// two cores (docs/log/2026-12-06-bench-notebook.md, "Few-row products on two
// cores"). With N >= 2 product threads (--product_threads, which follows
// --threads by default; common/model/cpu/cpu_flags.h), CpuMm and CpuAddmm
// (common/model/cpu/cpu_kernels.h) split each product of 2-32 rows into N
// column ranges, and the CPU panels (common/model/cpu/cpu_panels.h) each
// product of two or more rows, and of one row over a weight larger than a
// core's L2: the calling thread runs one range, and N - 1 helper threads of
// that model thread run the others. (More libtorch or OpenBLAS threads do not
// do this: OpenBLAS runs a small product on one thread, and their spinning
// threads slowed the engine down.)
//
// A helper polls for its next part for a while after each one (the gaps
// between a forward's products are tens of microseconds, shorter than waking a
// sleeping thread takes on a VM; docs/log/2026-12-06-bench-notebook.md, "Idle
// spin"), then sleeps. Parts are claimed, not assigned: the calling thread
// takes every part no helper has started, so a product never waits for a helper
// to wake up.
//
//   SetCpuProductThreads(2);                     // per process
//   CpuProductPool* pool = CpuProductPool::ForThisThread();  // or null
//   if (pool) pool->Run(2, [&](int part) { ... });
#ifndef DEDIT_MODEL_CPU_PRODUCT_POOL_H_
#define DEDIT_MODEL_CPU_PRODUCT_POOL_H_

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace dedit {

// Threads per model thread for few-row products (the caller included);
// <= 1 turns the pool off. Process-wide: the binaries' --product_threads.
void SetCpuProductThreads(int threads);
int CpuProductThreads();

// The most --product_threads takes.
inline constexpr int kMaxCpuProductThreads = 16;
// SetCpuProductThreads(threads) when 1 <= threads <= kMaxCpuProductThreads,
// else INVALID_ARGUMENT naming --product_threads.
absl::Status SetCpuProductThreadsFlag(int threads);

class CpuProductPool {
 public:
  // The calling thread's pool (created on first use, joined when the
  // thread exits), or null when CpuProductThreads() <= 1.
  static CpuProductPool* ForThisThread();
  // ForThisThread() for work over `rows` rows (attention, a blas product),
  // or null for one row: a decode step's one-row work stays on the model
  // thread, where handing half to a helper made it slower
  // (docs/log/2026-12-06-bench-notebook.md, "Few-row products on two cores").
  // The panels take ForThisThread() and decide by the weight's size.
  static CpuProductPool* ForRows(int64_t rows) {
    return rows >= 2 ? ForThisThread() : nullptr;
  }

  explicit CpuProductPool(int helpers);
  ~CpuProductPool();
  CpuProductPool(const CpuProductPool&) = delete;
  CpuProductPool& operator=(const CpuProductPool&) = delete;

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }
  // Calls to Run so far.
  int64_t runs() const { return runs_.load(); }

  // Runs part(0) .. part(parts - 1), each once, on this thread and the
  // helpers; returns when all have returned. An exception from a part is
  // rethrown here (the first one; the other parts still run). `part` must
  // not call Run.
  void Run(int parts, const std::function<void(int)>& part);

 private:
  struct Job {
    const std::function<void(int)>* part = nullptr;
    int parts = 0;
    std::atomic<int> next{0};
    std::atomic<int> done{0};
    absl::Mutex error_mu;
    std::exception_ptr error ABSL_GUARDED_BY(error_mu);
  };
  void HelperLoop();
  // Claims and runs parts of `job` until none is left.
  static void Work(Job* job);

  std::vector<std::thread> helpers_;
  std::atomic<Job*> job_{nullptr};
  std::atomic<uint64_t> generation_{0};
  // Helpers between seeing a generation and letting go of its job.
  std::atomic<int> active_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};
  std::atomic<int64_t> runs_{0};
  absl::Mutex mu_;
  absl::CondVar wake_;
};

}  // namespace dedit

#endif  // DEDIT_MODEL_CPU_PRODUCT_POOL_H_
