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
// before it is parsed; 0 = kMaxMessageBytes). The
// overall health status "" starts NOT_SERVING: the caller turns it SERVING
// once the process can serve (ServeUntilSignal: after the warm-up).
// UNAVAILABLE when it cannot listen.
absl::StatusOr<StartedServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    int max_receive_bytes = 0);

// Writes {"grpc_port": N, "metrics_port": M} to `path` atomically (a
// temporary file renamed over it), so a reader never sees a partial file.
// No-op for an empty path.
absl::Status WriteReadyFile(const std::string& path, int grpc_port,
                            int metrics_port);

// Channel arguments for internal clients: large messages, fast reconnects
// (a restarted peer is found again within about a second).
grpc::ChannelArguments InternalChannelArguments();

}  // namespace dedit

#endif  // DEDIT_SERVING_SERVER_BOOTSTRAP_H_
