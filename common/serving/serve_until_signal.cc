#include "common/serving/serve_until_signal.h"

#include <chrono>
#include <cstdio>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/serving/metrics_endpoint.h"
#include "common/serving/server_bootstrap.h"
#include "common/serving/service_readiness.h"
#include "common/serving/shutdown_signals.h"

namespace dedit {

absl::Status ServeUntilSignal(const ServeOptions& options,
                              const std::vector<grpc::Service*>& services,
                              std::shared_ptr<prometheus::Registry> registry,
                              const ServeHooks& hooks) {
  ASSIGN_OR_RETURN(
      StartedServer server,
      StartGrpcServer(options.listen_address, services,
                      options.max_receive_message_bytes, options.credentials,
                      options.receive_memory_bytes));
  HealthFanOut fan_out;
  fan_out.Add(server.server->GetHealthCheckService());
  std::optional<StartedServer> health_server;
  if (!options.health_listen_address.empty()) {
    ASSIGN_OR_RETURN(health_server,
                     StartHealthServer(options.health_listen_address));
    fan_out.Add(health_server->server->GetHealthCheckService());
  }
  // Shut down last, after the main server's drain: probes see NOT_SERVING
  // meanwhile.
  absl::Cleanup stop_health_server = [&health_server] {
    if (health_server) {
      health_server->server->Shutdown(std::chrono::system_clock::now());
    }
  };
  grpc::HealthCheckServiceInterface* health = &fan_out;
  if (options.readiness != nullptr) options.readiness->PublishTo(health);
  // `health` dies with the server; detached first on every return.
  absl::Cleanup detach_readiness = [&options] {
    if (options.readiness != nullptr) options.readiness->PublishTo(nullptr);
  };
  ASSIGN_OR_RETURN(
      std::unique_ptr<MetricsEndpoint> metrics,
      StartMetricsEndpoint(options.metrics_address, std::move(registry)));
  if (hooks.warm_up) {
    const absl::Status warm_up = hooks.warm_up();
    if (!warm_up.ok()) {
      return absl::Status(warm_up.code(),
                          absl::StrCat("warm-up failed: ", warm_up.message()));
    }
  }
  if (options.readiness != nullptr) {
    options.readiness->SetWarmedUp();
  } else {
    health->SetServingStatus("", true);
  }
  const int health_port = health_server ? health_server->port : 0;
  RETURN_IF_ERROR(WriteReadyFile(options.ready_file, server.port,
                                 metrics->port(), health_port));
  std::fprintf(stderr, "%s: %s, gRPC port %d, metrics port %d%s\n",
               options.binary.c_str(), options.banner.c_str(), server.port,
               metrics->port(),
               health_port > 0
                   ? absl::StrCat(", health port ", health_port).c_str()
                   : "");

  const int sig = WaitForShutdownSignal();
  std::fprintf(stderr, "%s: signal %d, draining\n", options.binary.c_str(),
               sig);
  // Detached first, so that no named status is published after this.
  std::move(detach_readiness).Invoke();
  health->SetServingStatus(false);
  if (hooks.before_drain) hooks.before_drain();
  server.server->Shutdown(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(options.drain_timeout_ms));
  if (hooks.after_drain) hooks.after_drain();
  return absl::OkStatus();
}

ServeOptions ServeOptionsFor(const std::string& host, int port,
                             int metrics_port, std::string ready_file,
                             int drain_timeout_ms) {
  ServeOptions o;
  o.listen_address = absl::StrCat(host, ":", port);
  o.metrics_address = absl::StrCat(host, ":", metrics_port);
  o.ready_file = std::move(ready_file);
  o.drain_timeout_ms = drain_timeout_ms;
  return o;
}

}  // namespace dedit
