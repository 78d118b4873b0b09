// The CPU kernel flags every binary that runs a model takes, defined once:
// --cpu_products (common/model/cpu/cpu_panels.h), --product_threads
// (common/model/cpu/cpu_product_pool.h) and --kv_cache_dtype
// (common/model/kv_pool.h). dedit-target, dedit-drafter, dedit-generate and
// dedit-engine-bench link this library and call ApplyCpuKernelFlags before
// loading a model.
#ifndef DEDIT_MODEL_CPU_FLAGS_H_
#define DEDIT_MODEL_CPU_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"

ABSL_DECLARE_FLAG(std::string, cpu_products);
ABSL_DECLARE_FLAG(int, product_threads);
ABSL_DECLARE_FLAG(std::string, kv_cache_dtype);

namespace dedit {

// `threads` (a binary's --threads), or the machine's cores when it is 0.
int ProcessComputeThreads(int threads);

// Sets the process's product threads, CPU product kernel and K/V cache
// dtype from the three flags; INVALID_ARGUMENT naming the flag when one is
// out of range. `threads` is the binary's --threads (0 = the machine's
// cores): --product_threads 0, the default, follows it, so that --threads N
// alone caps every compute thread of the process at N (libtorch's intra-op
// threads and the product pool take turns on the same N cores) and a
// one-row forward reads its weights on all of them. Then sets the calling
// thread's libtorch threads (SetCpuThreads, common/model/cpu/cpu_threads.h).
absl::Status ApplyCpuKernelFlags(int threads);

// What the flags resolved to ("auto" included), for the operator's log:
// "CPU weight products: bf16, product threads: 1, K/V cache: auto".
std::string CpuKernelSummary();

}  // namespace dedit

#endif  // DEDIT_MODEL_CPU_FLAGS_H_
