#include "model/cpu_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

namespace dedit {
namespace {

using SetThreadsFn = void (*)(int);

}  // namespace

void SetCpuThreads(int threads) {
  if (threads > 0) at::set_num_threads(threads);
  // Looked up at run time: libblas.so.3 is an alternative that may be
  // OpenBLAS (pthread or OpenMP build), the reference BLAS, or BLIS.
  const auto set_blas = reinterpret_cast<SetThreadsFn>(
      dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  // BLAS follows libtorch's count, so one flag decides both.
  if (set_blas != nullptr) set_blas(at::get_num_threads());
}

}  // namespace dedit
