// The gRPC side every dedit binary shares: a server with grpc.health.v1 and
// reflection, the ready file that names the bound ports (tests and scripts
// start services on port 0), and channel arguments for the internal
// clients. ServeUntilSignal (serve_until_signal.h) puts these together
// with /metrics and the drain; binaries call that, not these.
//
//   ASSIGN_OR_RETURN(StartedServer server,
//                    StartGrpcServer("0.0.0.0:0", {&service}));
//   RETURN_IF_ERROR(WriteReadyFile(path, server.port, metrics_port));
//   auto channel = grpc::CreateCustomChannel(
//       address, grpc::InsecureChannelCredentials(),
//       InternalChannelArguments());
#ifndef DEDIT_SERVING_SERVER_BOOTSTRAP_H_
#define DEDIT_SERVING_SERVER_BOOTSTRAP_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dedit {

// Messages carry whole feature blocks (a long prompt's features are
// prompt_len x n_ids x hidden bf16 values), far above gRPC's 4 MiB default.
inline constexpr int kMaxMessageBytes = 1 << 30;

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port (useful with port 0)
};

// Starts a server on `address` ("host:port", port 0 = ephemeral) with the
// default health service, reflection, kMaxMessageBytes sent and at most
// `max_receive_bytes` received (a larger message is RESOURCE_EXHAUSTED
// before it is parsed; 0 = kMaxMessageBytes), listening with `credentials`
// (null = plaintext, InternalAuth::ServerCredentials() for internal
// ports). The overall health status "" starts NOT_SERVING: the caller
// turns it SERVING once the process can serve (ServeUntilSignal: after the
// warm-up). UNAVAILABLE when it cannot listen (with credentials that
// cannot serve, too).
//
// `receive_memory_bytes` > 0 caps the memory gRPC's transport may hold for
// the server (a grpc::ResourceQuota). gRPC 1.51 checks `max_receive_bytes`
// only once a message is whole, and without a quota it buffers all of an
// oversized message first: the process grows by the whole message before
// refusing it. Under a quota the same message is still RESOURCE_EXHAUSTED
// and the growth stays near the quota (docs/SERVICES.md). Give a public
// port one.
absl::StatusOr<StartedServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    int max_receive_bytes = 0,
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr,
    int64_t receive_memory_bytes = 0);

// A plaintext server on `address` with the default health service (and
// reflection) only: Kubernetes' gRPC probes speak neither TLS nor tokens,
// so a service whose port needs them answers its probes here. Statuses
// start NOT_SERVING; mirror the main server's into it with HealthFanOut.
absl::StatusOr<StartedServer> StartHealthServer(const std::string& address);

// Sets every status on several health services at once (the main
// server's and the health port's), in the same order.
class HealthFanOut final : public grpc::HealthCheckServiceInterface {
 public:
  // Not owned; add all before the first status is set.
  void Add(grpc::HealthCheckServiceInterface* health) {
    targets_.push_back(health);
  }
  void SetServingStatus(const std::string& service_name, bool serving) override;
  void SetServingStatus(bool serving) override;
  void Shutdown() override;

 private:
  std::vector<grpc::HealthCheckServiceInterface*> targets_;
};

// Writes {"grpc_port": N, "metrics_port": M} to `path` atomically (a
// temporary file renamed over it), so a reader never sees a partial file;
// with a health port ("health_port": H) after them. No-op for an empty
// path.
absl::Status WriteReadyFile(const std::string& path, int grpc_port,
                            int metrics_port, int health_port = 0);

// Channel arguments for internal clients: large messages, fast reconnects
// (a restarted peer is found again within about a second).
grpc::ChannelArguments InternalChannelArguments();

}  // namespace dedit

#endif  // DEDIT_SERVING_SERVER_BOOTSTRAP_H_
