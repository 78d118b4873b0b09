// The internal authentication flags (internal_auth.h), defined once for
// every binary that makes or takes internal calls: the three gRPC servers
// (through service_flags.h) and dedit-openai, the router's client.
//
//   --internal_token_file  the shared token (loopback only)
//   --tls_cert --tls_key --tls_ca  mTLS
//   --tls_refresh_s        how often the PEM files are checked for a
//                          rotation (the token file: at most every second)
#ifndef DEDIT_SERVING_INTERNAL_AUTH_FLAGS_H_
#define DEDIT_SERVING_INTERNAL_AUTH_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "common/serving/internal_auth.h"

ABSL_DECLARE_FLAG(std::string, internal_token_file);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(int, tls_refresh_s);

namespace dedit {

// The flags, as given (tls_server_name left empty: the router's and the
// gateway's own flag). InternalAuth::Load checks the files.
InternalAuthOptions InternalAuthOptionsFromFlags();

}  // namespace dedit

#endif  // DEDIT_SERVING_INTERNAL_AUTH_FLAGS_H_
