// The flags every dedit gRPC server binary (dedit-target, dedit-drafter,
// dedit-router) takes, defined once: where it listens and what it writes
// once serving (--host, --ready_file), and how its internal calls are
// authenticated (internal_auth_flags.h: --internal_token_file, --tls_cert,
// --tls_key, --tls_ca, --tls_refresh_s). Each of those binaries links this
// library and fills its server options with ReadServiceFlags.
//
// --port, --metrics_port and --drain_timeout_ms are defined in each
// binary's main.cc, because their defaults differ per binary (each service
// has its own ports, and a drain lasts as long as that service's calls
// may); ReadServiceFlags takes their values. The model services add
// model_service_flags.h's; the router adds --tls_server_name.
#ifndef DEDIT_SERVING_SERVICE_FLAGS_H_
#define DEDIT_SERVING_SERVICE_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "common/serving/internal_auth.h"
#include "common/serving/internal_auth_flags.h"
#include "common/serving/serve_until_signal.h"

ABSL_DECLARE_FLAG(std::string, host);
ABSL_DECLARE_FLAG(std::string, ready_file);

namespace dedit {

struct ServiceFlags {
  // ServeOptionsFor(--host, port, metrics_port, --ready_file,
  // drain_timeout_ms): binary and banner are left to the server.
  ServeOptions serve;
  // The auth flags, as given; tls_server_name is left empty.
  InternalAuthOptions auth;
};

// The flags above, with the binary's own --port, --metrics_port and
// --drain_timeout_ms values. Nothing to validate: a bad address or file is
// reported when the server binds it or InternalAuth::Load reads it.
ServiceFlags ReadServiceFlags(int port, int metrics_port, int drain_timeout_ms);

}  // namespace dedit

#endif  // DEDIT_SERVING_SERVICE_FLAGS_H_
