// The CPU kernel flags every binary that runs a model takes, defined once:
// --cpu_products (model/cpu_panels.h), --product_threads
// (model/cpu_product_pool.h) and --kv_cache_dtype (model/kv_pool.h).
// dedit-target, dedit-drafter, dedit-generate and dedit-engine-bench link this
// library and call ApplyCpuKernelFlags before loading a model.
#ifndef DEDIT_MODEL_CPU_FLAGS_H_
#define DEDIT_MODEL_CPU_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"

ABSL_DECLARE_FLAG(std::string, cpu_products);
ABSL_DECLARE_FLAG(int, product_threads);
ABSL_DECLARE_FLAG(std::string, kv_cache_dtype);

namespace dedit {

// Sets the process's product threads, CPU product kernel and K/V cache
// dtype from the three flags; INVALID_ARGUMENT naming the flag when one is
// out of range.
absl::Status ApplyCpuKernelFlags();

// What the flags resolved to ("auto" included), for the operator's log:
// "CPU weight products: bf16, product threads: 1, K/V cache: auto".
std::string CpuKernelSummary();

}  // namespace dedit

#endif  // DEDIT_MODEL_CPU_FLAGS_H_
