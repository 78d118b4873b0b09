#include "common/serving/model_service_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/model/cpu/cpu_flags.h"

ABSL_FLAG(std::string, device, "cpu", "cpu, cuda, cuda:N");
ABSL_FLAG(std::string, dtype, "float32", "compute dtype: float32 or bfloat16");
ABSL_FLAG(int, threads, 0,
          "CPU compute threads: libtorch's and the weight-product pool's (0 = "
          "the machine's cores; common/model/cpu/cpu_flags.h)");
ABSL_FLAG(int, health_port, -1,
          "plaintext port serving grpc.health.v1 only, for probes that "
          "cannot speak TLS (0 = ephemeral, -1 = none)");

namespace dedit {

absl::StatusOr<ModelServiceFlags> ReadModelServiceFlags(int port,
                                                        int metrics_port,
                                                        int drain_timeout_ms) {
  ModelServiceFlags flags;
  flags.device = absl::GetFlag(FLAGS_device);
  flags.dtype = absl::GetFlag(FLAGS_dtype);
  flags.cpu_threads = absl::GetFlag(FLAGS_threads);
  RETURN_IF_ERROR(ApplyCpuKernelFlags(flags.cpu_threads));
  static_cast<ServiceFlags&>(flags) =
      ReadServiceFlags(port, metrics_port, drain_timeout_ms);
  const int health_port = absl::GetFlag(FLAGS_health_port);
  if (health_port < -1 || health_port > 65535) {
    return absl::InvalidArgumentError(
        "--health_port must be -1 (none) or 0..65535");
  }
  if (health_port >= 0) {
    flags.serve.health_listen_address =
        absl::StrCat(absl::GetFlag(FLAGS_host), ":", health_port);
  }
  return flags;
}

}  // namespace dedit
