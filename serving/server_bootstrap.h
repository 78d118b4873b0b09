// What every dedit binary does around its service: a gRPC server with
// grpc.health.v1 and reflection, a Prometheus exposer for /metrics, a ready
// file naming the bound ports (tests and scripts start services on port 0),
// and SIGTERM/SIGINT handling for a graceful drain.
//
//   int main(...) {
//     BlockShutdownSignals();            // first, before any thread starts
//     ... build the service ...
//     ASSIGN_OR_RETURN(auto server, StartGrpcServer(listen, {&service}));
//     ASSIGN_OR_RETURN(auto metrics, StartMetricsEndpoint(addr, registry));
//     WaitForShutdownSignal();
//     server.server->Shutdown(deadline);  // drains in-flight RPCs
//   }
#ifndef DEDIT_SERVING_SERVER_BOOTSTRAP_H_
#define DEDIT_SERVING_SERVER_BOOTSTRAP_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"

namespace dedit {

// Blocks SIGTERM and SIGINT in the calling thread and in every thread it
// starts afterwards, so that WaitForShutdownSignal() alone receives them.
void BlockShutdownSignals();
// Waits for SIGTERM or SIGINT; returns the signal number.
int WaitForShutdownSignal();

// The end of a main() whose server has drained and whose owned threads are
// joined: logs "<binary>: drained, exiting", flushes stdio and leaves with
// status 0 without running static destructors. Those were seen racing
// gRPC's own background threads at exit (SIGSEGV after a clean drain,
// under load), which would turn a clean SIGTERM into a crash report.
[[noreturn]] void ExitAfterDrain(const char* binary);

// Messages carry whole feature blocks (a long prompt's features are
// prompt_len x n_ids x hidden bf16 values), far above gRPC's 4 MiB default.
inline constexpr int kMaxMessageBytes = 1 << 30;

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port (useful with port 0)
};

// Starts a server on `address` ("host:port", port 0 = ephemeral) with the
// default health service (SERVING) and reflection.
absl::StatusOr<StartedServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services);

// A minimal HTTP/1.0 endpoint serving the registry as Prometheus text on
// GET /metrics (any other path: 404). One thread, one connection at a time
// — scrapes are rare and small. (prometheus-cpp's civetweb Exposer fails
// to start inside processes that load libtorch on Debian 12, so the
// exposition is served here instead.)
class MetricsEndpoint {
 public:
  ~MetricsEndpoint();  // stops serving
  int port() const { return port_; }

 private:
  friend absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
      const std::string&, std::shared_ptr<prometheus::Registry>);
  MetricsEndpoint() = default;
  void Serve();

  std::shared_ptr<prometheus::Registry> registry_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// Serves `registry` on http://address/metrics ("host:port", port 0 =
// ephemeral).
absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry);

// Writes {"grpc_port": N, "metrics_port": M} to `path` atomically (no-op
// for an empty path).
absl::Status WriteReadyFile(const std::string& path, int grpc_port,
                            int metrics_port);

// Channel arguments for internal clients: large messages, fast reconnects
// (a restarted peer is found again within about a second).
grpc::ChannelArguments InternalChannelArguments();

}  // namespace dedit

#endif  // DEDIT_SERVING_SERVER_BOOTSTRAP_H_
