#include "model/cpu_flags.h"

#include "absl/flags/flag.h"
#include "base/status.h"
#include "model/cpu_panels.h"
#include "model/cpu_product_pool.h"
#include "model/kv_pool.h"

ABSL_FLAG(std::string, cpu_products, "auto",
          "CPU kernels for fp32 weight products and attention: bf16 or f32 "
          "(this project's AVX-512 kernels; model/cpu_panels.h), blas "
          "(libtorch/OpenBLAS), auto (the fastest this CPU runs)");
ABSL_FLAG(int, product_threads, 1,
          "threads per model thread for products of 2-32 rows (1 = the model "
          "thread alone; model/cpu_product_pool.h)");

ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "K/V cache element type: auto (the model's dtype) or bf16 (half "
          "the bytes; on the CPU, the bf16 row attention kernel; "
          "model/kv_pool.h)");

namespace dedit {

absl::Status ApplyCpuKernelFlags() {
  RETURN_IF_ERROR(
      SetCpuProductThreadsFlag(absl::GetFlag(FLAGS_product_threads)));
  RETURN_IF_ERROR(SetCpuProductsFlag(absl::GetFlag(FLAGS_cpu_products)));
  return SetKvCacheDtypeFlag(absl::GetFlag(FLAGS_kv_cache_dtype));
}

}  // namespace dedit
