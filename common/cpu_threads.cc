#include "common/cpu_threads.h"

#include <dlfcn.h>

#include <ATen/Parallel.h>

namespace dedit {
namespace {

using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();

// Looked up at run time: libblas.so.3 is an alternative that may be
// OpenBLAS (pthread or OpenMP build), the reference BLAS, or BLIS.
template <typename Fn>
Fn Lookup(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

int SetCpuThreads(int threads) {
  const auto set_blas = Lookup<SetThreadsFn>("openblas_set_num_threads");
  const auto get_blas = Lookup<GetThreadsFn>("openblas_get_num_threads");
  if (threads > 0) at::set_num_threads(threads);
  // BLAS follows libtorch's count, so one flag decides both.
  if (set_blas != nullptr) set_blas(at::get_num_threads());
  return get_blas != nullptr ? get_blas() : -1;
}

}  // namespace dedit
