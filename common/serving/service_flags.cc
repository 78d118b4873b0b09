#include "common/serving/service_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "listen host");
ABSL_FLAG(std::string, ready_file, "",
          "written with the bound ports once serving");
ABSL_FLAG(std::string, internal_token_file, "",
          "file holding the shared token internal calls must carry "
          "(loopback only; see docs/SERVICES.md, \"Internal authentication\")");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of this process: mTLS to its peers and, "
          "on dedit-target and dedit-drafter, on the gRPC port "
          "(dedit-router's public port stays plaintext); with --tls_key and "
          "--tls_ca");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s) that every peer's certificate chains to");

namespace dedit {

ServiceFlags ReadServiceFlags(int port, int metrics_port,
                              int drain_timeout_ms) {
  ServiceFlags flags;
  flags.serve =
      ServeOptionsFor(absl::GetFlag(FLAGS_host), port, metrics_port,
                      absl::GetFlag(FLAGS_ready_file), drain_timeout_ms);
  flags.auth.token_file = absl::GetFlag(FLAGS_internal_token_file);
  flags.auth.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  flags.auth.tls_key = absl::GetFlag(FLAGS_tls_key);
  flags.auth.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  return flags;
}

}  // namespace dedit
