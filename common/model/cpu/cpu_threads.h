// CPU thread counts for libtorch and the BLAS library under it.
//
// libtorch's intra-op pool and OpenBLAS's own pthread pool are separate:
// at::set_num_threads does not reach OpenBLAS, which by default starts one
// spinning thread per core for every GEMM with more than one row. On a
// shared CPU that made a 16-token verify several times slower than with one
// BLAS thread (docs/log/2026-12-06-bench-notebook.md, "CPU threads: libtorch
// and OpenBLAS"), so every binary sets both with this.
#ifndef DEDIT_MODEL_CPU_THREADS_H_
#define DEDIT_MODEL_CPU_THREADS_H_

#include <c10/core/InferenceMode.h>

namespace dedit {

// Sets libtorch's intra-op threads to LibtorchThreadsFor(threads)
// (threads <= 0 keeps libtorch's default) and, when the process's BLAS is
// OpenBLAS, its thread count to the same number; other BLAS libraries are
// left as they are. The products' own threads are set apart
// (SetCpuProductThreads, common/model/cpu/cpu_product_pool.h;
// common/model/cpu/cpu_flags.h sets both from --threads): more intra-op and
// BLAS threads made a verify slower on a small CPU
// (docs/log/2026-12-06-bench-notebook.md, "CPU threads: libtorch and
// OpenBLAS"). Call it after the CPU kernel flags are applied
// (ApplyCpuKernelFlags), since the count depends on them.
void SetCpuThreads(int threads);

// `threads`, or 1 when the process's products run on CPU panels with a
// product pool of 2 or more threads: there the pool does the parallel
// work, and libtorch's threads would only spin beside it.
int LibtorchThreadsFor(int threads);

// What a model thread sets first and keeps for its life (docs/ARCHITECTURE.md
// §7): inference mode (no autograd bookkeeping) and its CPU thread counts.
// OpenMP's thread count is per calling thread, so it is set here, on the
// model thread, not in main().
//
//   void Worker::Run() {
//     ModelThreadScope scope(options_.cpu_threads);
//     ...
class ModelThreadScope {
 public:
  explicit ModelThreadScope(int cpu_threads) { SetCpuThreads(cpu_threads); }
  ModelThreadScope(const ModelThreadScope&) = delete;
  ModelThreadScope& operator=(const ModelThreadScope&) = delete;

 private:
  c10::InferenceMode inference_mode_;
};

}  // namespace dedit

#endif  // DEDIT_MODEL_CPU_THREADS_H_
