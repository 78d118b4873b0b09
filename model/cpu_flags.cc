#include "model/cpu_flags.h"

#include "absl/flags/flag.h"
#include "base/status.h"
#include "model/cpu_panels.h"
#include "model/cpu_product_pool.h"

ABSL_FLAG(std::string, cpu_products, "auto",
          "CPU kernels for fp32 weight products and attention: bf16 or f32 "
          "(this project's AVX-512 kernels; model/cpu_panels.h), blas "
          "(libtorch/OpenBLAS), auto (the fastest this CPU runs)");
ABSL_FLAG(int, product_threads, 1,
          "threads per model thread for products of 2-32 rows (1 = the model "
          "thread alone; model/cpu_product_pool.h)");

namespace dedit {

absl::Status ApplyCpuKernelFlags() {
  RETURN_IF_ERROR(
      SetCpuProductThreadsFlag(absl::GetFlag(FLAGS_product_threads)));
  return SetCpuProductsFlag(absl::GetFlag(FLAGS_cpu_products));
}

}  // namespace dedit
