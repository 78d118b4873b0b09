// Authentication of the internal gRPC calls (router → target, router →
// drafter, target → drafter context stream), in one
// place for the servers (target, drafter) and the clients (router,
// target). Three modes, from the same flags on every binary:
//
//   * none (no flag): plaintext, and anyone who reaches the port may call
//     it. For local development only.
//   * token (--internal_token_file): every call carries the shared token
//     in its `authorization: Bearer …` metadata; servers refuse a call
//     without the right one UNAUTHENTICATED (compared in constant time).
//     For local runs: the transport is gRPC's local credentials, which
//     accept loopback peers only (a server refuses other addresses at the
//     handshake, a client never sends the token off the host), since a
//     token in clear text over a network would be readable on the way.
//   * mTLS (--tls_cert, --tls_key, --tls_ca): TLS both ways, every peer's
//     certificate signed by the CA; a client without a valid certificate
//     is refused at the handshake. What the Kubernetes manifests use. A
//     token may be added on top.
//
// Rotation (a Kubernetes Secret updated in place): no restart is needed.
// The token file is re-read when it changes (checked at most once a
// second, on the next call); clients send the new token from then on and
// servers accept the new one and, for kPreviousTokenGraceSeconds, the
// previous one, since every pod sees the new Secret at its own time. The
// PEM files are watched by gRPC's FileWatcherCertificateProvider every
// tls_refresh_s; new handshakes use the new certificate and CA, open
// connections keep theirs.
//
// The standard health service grpc.health.v1.Health needs no token
// (Kubernetes probes carry none); under mTLS its TLS handshake still needs
// a client certificate, so the services can also serve health alone on a
// plaintext port (ServeOptions::health_listen_address, --health_port).
//
//   ASSIGN_OR_RETURN(InternalAuth auth, InternalAuth::Load(options.auth));
//   serve.credentials = auth.ServerCredentials();
//   auto channel = auth.Channel("127.0.0.1:50052", InternalChannelArguments());
#ifndef DEDIT_SERVING_INTERNAL_AUTH_H_
#define DEDIT_SERVING_INTERNAL_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dedit {

// The flags, as given: file paths, never the secrets themselves.
struct InternalAuthOptions {
  std::string token_file;  // --internal_token_file
  std::string tls_cert;    // --tls_cert: this process's PEM certificate chain
  std::string tls_key;     // --tls_key: its PEM private key
  std::string tls_ca;  // --tls_ca: PEM CA certificate(s) every peer chains to
  // Clients only (the router's --tls_server_name): the name the servers'
  // certificates must carry, when it is not the host of the address the
  // client dials (the router dials stack pods by IP).
  std::string tls_server_name;
  // How often the PEM files are checked for a rotation.
  int tls_refresh_s = 60;
};

// How long a server still accepts the token a rotation replaced.
inline constexpr int kPreviousTokenGraceSeconds = 300;

class RotatingToken;

// The shortest token accepted (bytes); `openssl rand -hex 32` makes 64.
inline constexpr size_t kMinInternalTokenBytes = 16;
// Metadata key of the token ("authorization: Bearer <token>").
inline constexpr char kInternalTokenMetadataKey[] = "authorization";

class InternalAuth {
 public:
  InternalAuth() = default;  // mode none

  // Reads and checks the files: the token (printable ASCII without spaces,
  // at least kMinInternalTokenBytes, surrounding whitespace dropped), the
  // three PEM files together, the key matching the certificate, and the
  // certificate chaining to the CA and valid now. Errors name the flag and
  // the file (INVALID_ARGUMENT, or NOT_FOUND / PERMISSION_DENIED from
  // reading), never the token. A rotated file that fails these checks is
  // logged and the last good one kept.
  static absl::StatusOr<InternalAuth> Load(const InternalAuthOptions& options);

  bool token() const { return token_ != nullptr; }
  bool tls() const { return !tls_cert_.empty(); }
  // "plaintext, no authentication", "token, loopback only", "mTLS",
  // "mTLS + token": for the start-up banner.
  std::string Describe() const;

  // For a server's internal port: SSL with client certificates required
  // and verified against the CA (mTLS), local credentials (token alone),
  // plaintext (none); with a token, an AuthMetadataProcessor refuses every
  // call but grpc.health.v1.Health's without it.
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;

  // A channel to an internal server (`args`: InternalChannelArguments()),
  // presenting this process's certificate and/or token.
  std::shared_ptr<grpc::Channel> Channel(const std::string& address,
                                         grpc::ChannelArguments args) const;

 private:
  // Shared by the copies of this object and every channel and server
  // made from it: one file watch per process.
  std::shared_ptr<RotatingToken> token_;
  std::string tls_cert_, tls_key_, tls_ca_;  // paths
  std::string server_name_;
  int tls_refresh_s_ = 60;
};

// a == b, in time that depends on the lengths only, not on where they
// differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace dedit

#endif  // DEDIT_SERVING_INTERNAL_AUTH_H_
