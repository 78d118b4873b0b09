#include "common/serving/internal_auth_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, internal_token_file, "",
          "file holding the shared token internal calls must carry "
          "(loopback only; re-read when it changes; see docs/SERVICES.md, "
          "\"Internal authentication\")");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of this process: mTLS to its peers and, "
          "on dedit-target and dedit-drafter (and dedit-router with "
          "--authenticate_clients), on the gRPC port; with --tls_key and "
          "--tls_ca");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s) that every peer's certificate chains to");
ABSL_FLAG(int, tls_refresh_s, 60,
          "how often --tls_cert, --tls_key and --tls_ca are checked for a "
          "rotation (new handshakes use the new files; no restart)");

namespace dedit {

InternalAuthOptions InternalAuthOptionsFromFlags() {
  InternalAuthOptions o;
  o.token_file = absl::GetFlag(FLAGS_internal_token_file);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  o.tls_refresh_s = absl::GetFlag(FLAGS_tls_refresh_s);
  return o;
}

}  // namespace dedit
