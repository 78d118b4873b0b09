// The flags the two model services (dedit-target, dedit-drafter) take on
// top of service_flags.h's and the CPU kernel flags
// (common/model/cpu/cpu_flags.h), defined once: --device, --dtype,
// --threads and --health_port. Both binaries link this library and call
// ReadModelServiceFlags before loading a model; it links the model
// library's CPU flags, so the torch-free router does not take it.
#ifndef DEDIT_SERVING_MODEL_SERVICE_FLAGS_H_
#define DEDIT_SERVING_MODEL_SERVICE_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "common/serving/service_flags.h"

ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(int, health_port);

namespace dedit {

// serve gets health_listen_address "--host:--health_port" too, unless
// --health_port is -1.
struct ModelServiceFlags : ServiceFlags {
  std::string device;   // --device: cpu, cuda, cuda:N
  std::string dtype;    // --dtype: float32 or bfloat16
  int cpu_threads = 0;  // --threads (0 = the machine's cores)
};

// Reads the flags above and service_flags.h's (with the binary's own
// --port, --metrics_port and --drain_timeout_ms values), then sets the
// process's CPU kernels from --threads and the CPU kernel flags
// (ApplyCpuKernelFlags). INVALID_ARGUMENT naming the flag when one is out
// of range: --health_port must be -1 (none) or 0..65535.
absl::StatusOr<ModelServiceFlags> ReadModelServiceFlags(int port,
                                                        int metrics_port,
                                                        int drain_timeout_ms);

}  // namespace dedit

#endif  // DEDIT_SERVING_MODEL_SERVICE_FLAGS_H_
