#include "common/model/cpu/cpu_flags.h"

#include <algorithm>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/cpu/cpu_product_pool.h"
#include "common/model/cpu/cpu_threads.h"
#include "common/model/kv_pool.h"

ABSL_FLAG(
    std::string, cpu_products, "auto",
    "CPU kernels for fp32 weight products and attention: bf16 or f32 "
    "(this project's AVX-512 or AVX2+FMA kernels, the widest this CPU runs; "
    "common/model/cpu/cpu_panels.h), blas "
    "(libtorch/OpenBLAS), auto (the fastest this CPU runs)");
ABSL_FLAG(
    int, product_threads, 0,
    "threads per model thread for weight products, the model thread "
    "included (1 = the model thread alone; 0 = --threads, or the "
    "machine's cores when that is 0 too; common/model/cpu/cpu_product_pool.h)");

ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "K/V cache element type: bf16 (half the bytes; on the CPU, read "
          "by the bf16 row attention kernel), model (the model's dtype), or "
          "auto: bf16 under --cpu_products bf16 where the kernel takes the "
          "head size, else the model's (common/model/kv_pool.h)");

namespace dedit {

int ProcessComputeThreads(int threads) {
  if (threads > 0) return threads;
  const unsigned cores = std::thread::hardware_concurrency();
  return cores == 0 ? 1 : static_cast<int>(cores);
}

absl::Status ApplyCpuKernelFlags(int threads) {
  const int product_threads = absl::GetFlag(FLAGS_product_threads);
  if (product_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--product_threads must be 0 (follow --threads) or 1..",
                     kMaxCpuProductThreads, ", got ", product_threads));
  }
  if (threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--threads must be 0 (the machine's cores) or more, got ", threads));
  }
  RETURN_IF_ERROR(SetCpuProductThreadsFlag(
      product_threads > 0
          ? product_threads
          : std::min(ProcessComputeThreads(threads), kMaxCpuProductThreads)));
  RETURN_IF_ERROR(SetCpuProductsFlag(absl::GetFlag(FLAGS_cpu_products)));
  RETURN_IF_ERROR(SetKvCacheDtypeFlag(absl::GetFlag(FLAGS_kv_cache_dtype)));
  // The calling thread's libtorch threads, which depend on the two above.
  SetCpuThreads(threads);
  return absl::OkStatus();
}

std::string CpuKernelSummary() {
  return absl::StrCat(
      "CPU weight products: ", std::string(CpuProductsName(GetCpuProducts())),
      ", product threads: ", CpuProductThreads(),
      ", K/V cache: ", std::string(KvCacheDtypeName(GetKvCacheDtype())));
}

}  // namespace dedit
