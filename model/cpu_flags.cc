#include "model/cpu_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
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
          "K/V cache element type: bf16 (half the bytes; on the CPU, read "
          "by the bf16 row attention kernel), model (the model's dtype), or "
          "auto: bf16 under --cpu_products bf16 where the kernel takes the "
          "head size, else the model's (model/kv_pool.h)");

namespace dedit {

absl::Status ApplyCpuKernelFlags() {
  RETURN_IF_ERROR(
      SetCpuProductThreadsFlag(absl::GetFlag(FLAGS_product_threads)));
  RETURN_IF_ERROR(SetCpuProductsFlag(absl::GetFlag(FLAGS_cpu_products)));
  return SetKvCacheDtypeFlag(absl::GetFlag(FLAGS_kv_cache_dtype));
}

std::string CpuKernelSummary() {
  return absl::StrCat(
      "CPU weight products: ", std::string(CpuProductsName(GetCpuProducts())),
      ", product threads: ", CpuProductThreads(),
      ", K/V cache: ", std::string(KvCacheDtypeName(GetKvCacheDtype())));
}

}  // namespace dedit
