// The /metrics endpoint every dedit binary serves: Prometheus text over
// HTTP for a prometheus::Registry.
//
//   auto registry = std::make_shared<prometheus::Registry>();
//   ASSIGN_OR_RETURN(std::unique_ptr<MetricsEndpoint> metrics,
//                    StartMetricsEndpoint("0.0.0.0:9101", registry));
//   metrics->port();  // the bound port (useful with port 0)
//
// A minimal HTTP/1.0 server: GET /metrics (or /) returns the registry as
// Prometheus text, any other path 404. One thread, one connection at a
// time — scrapes are rare and small. (prometheus-cpp's civetweb Exposer
// fails to start inside processes that load libtorch on Debian 12, so the
// exposition is served here instead.)
#ifndef DEDIT_SERVING_METRICS_ENDPOINT_H_
#define DEDIT_SERVING_METRICS_ENDPOINT_H_

#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace dedit {

class MetricsEndpoint {
 public:
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;
  // Stops serving: closes the listening socket and joins the thread (an
  // in-progress scrape finishes first; its socket times out after 2 s).
  ~MetricsEndpoint();

  int port() const { return port_; }

 private:
  friend absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
      const std::string&, std::shared_ptr<prometheus::Registry>);
  MetricsEndpoint(std::shared_ptr<prometheus::Registry> registry, int listen_fd,
                  int port);
  void Serve();

  // Set before the thread starts and read-only while it runs, so not
  // locked. Stopping needs no flag: shutdown() of the listening socket
  // fails the blocked accept() and every later one, which ends Serve().
  const std::shared_ptr<prometheus::Registry> registry_;
  const int listen_fd_;
  const int port_;
  std::thread thread_;
};

// Serves `registry` on http://address/metrics ("host:port" with an IPv4
// host, "localhost" or empty for any; port 0 = ephemeral).
// INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it cannot
// listen.
absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry);

}  // namespace dedit

#endif  // DEDIT_SERVING_METRICS_ENDPOINT_H_
