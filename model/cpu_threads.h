// CPU thread counts for libtorch and the BLAS library under it.
//
// libtorch's intra-op pool and OpenBLAS's own pthread pool are separate:
// at::set_num_threads does not reach OpenBLAS, which by default starts one
// spinning thread per core for every GEMM with more than one row. On a
// shared CPU that made a 16-token verify ~7x slower than with one BLAS
// thread (bench/README.md), so every binary sets both with this.
#ifndef DEDIT_MODEL_CPU_THREADS_H_
#define DEDIT_MODEL_CPU_THREADS_H_

namespace dedit {

// Sets libtorch's intra-op threads to `threads` (threads <= 0 keeps
// libtorch's default) and, when the process's BLAS is OpenBLAS, its thread
// count to the same number; other BLAS libraries are left as they are.
void SetCpuThreads(int threads);

}  // namespace dedit

#endif  // DEDIT_MODEL_CPU_THREADS_H_
