#include "common/model/cpu/cpu_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include "common/model/cpu/cpu_panels.h"
#include "common/model/cpu/cpu_product_pool.h"

namespace dedit {
namespace {

using SetThreadsFn = void (*)(int);

}  // namespace

int LibtorchThreadsFor(int threads) {
  // On the CPU panels, a forward's work is this project's products and
  // attention, spread over the product pool; the few ATen ops left (an
  // embedding gather, the final norm) are too small to split. Intra-op
  // threads there only spin (libgomp waits busily after each parallel
  // region) on the cores the pool's helpers need: with both on two cores a
  // 17-row forward of a DRAM-bound model took longer
  // (docs/log/2026-12-06-bench-notebook.md, "The production regime").
  if (GetCpuProducts() != CpuProducts::kBlas && CpuProductThreads() > 1) {
    return 1;
  }
  return threads;
}

void SetCpuThreads(int threads) {
  threads = LibtorchThreadsFor(threads);
  if (threads > 0) at::set_num_threads(threads);
  // Looked up at run time: libblas.so.3 is an alternative that may be
  // OpenBLAS (pthread or OpenMP build), the reference BLAS, or BLIS.
  const auto set_blas = reinterpret_cast<SetThreadsFn>(
      dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  // BLAS follows libtorch's count, so one flag decides both.
  if (set_blas != nullptr) set_blas(at::get_num_threads());
}

}  // namespace dedit
