#include "common/serving/service_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "listen host");
ABSL_FLAG(std::string, ready_file, "",
          "written with the bound ports once serving");

namespace dedit {

ServiceFlags ReadServiceFlags(int port, int metrics_port,
                              int drain_timeout_ms) {
  ServiceFlags flags;
  flags.serve =
      ServeOptionsFor(absl::GetFlag(FLAGS_host), port, metrics_port,
                      absl::GetFlag(FLAGS_ready_file), drain_timeout_ms);
  flags.auth = InternalAuthOptionsFromFlags();
  return flags;
}

}  // namespace dedit
