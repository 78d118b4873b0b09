// The /metrics endpoint every dedit binary serves: Prometheus text over
// HTTP for a prometheus::Registry.
//
//   auto registry = std::make_shared<prometheus::Registry>();
//   ASSIGN_OR_RETURN(std::unique_ptr<MetricsEndpoint> metrics,
//                    StartMetricsEndpoint("0.0.0.0:9101", registry));
//   metrics->port();  // the bound port (useful with port 0)
//
// Served by cpp-httplib (Debian's libcpp-httplib 0.11, as the gateway):
// GET /metrics (or /) returns the registry as Prometheus text, any other
// path 404. Connections are served concurrently by a small thread pool,
// one request per connection (`Connection: close`), and every connection
// has a whole-request deadline: cpp-httplib's own read timeout applies to
// each read, so a client that sends a byte every second could hold a
// thread for ever (a slow-loris client); here a connection is closed once
// `request_deadline` has passed since it was accepted, or once it sent
// more than `max_request_bytes`, whatever it is still doing. Scrapes are small
// and fast, so the deadline costs a normal scraper nothing. With more slow
// connections than threads open at once, later connections wait in the pool's
// queue; the deadline, counted from the accept, still frees every thread within
// `request_deadline`, and in Kubernetes the NetworkPolicies let only the
// monitoring namespace reach the port (deploy/k8s/base/network-policies.yaml).
// (prometheus-cpp's civetweb Exposer fails to start inside processes that load
// libtorch on Debian 12, so it is not used.)
#ifndef DEDIT_SERVING_METRICS_ENDPOINT_H_
#define DEDIT_SERVING_METRICS_ENDPOINT_H_

#include <prometheus/registry.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"

namespace dedit {

struct MetricsEndpointOptions {
  // Connections served at once; more wait in the queue.
  int threads = 8;
  // From the accept to the last byte of the response: reading the request
  // and writing the answer must fit in it, else the connection is closed.
  std::chrono::milliseconds request_deadline{5000};
  // Request line and headers together (a scrape sends a few hundred).
  int max_request_bytes = 16384;
};

class MetricsEndpoint {
 public:
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;
  // Stops serving: closes the listening socket and every open connection,
  // then joins the threads.
  ~MetricsEndpoint();

  int port() const { return port_; }

  class HttpServer;  // cpp-httplib, metrics_endpoint.cc

 private:
  friend absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
      const std::string&, std::shared_ptr<prometheus::Registry>,
      const MetricsEndpointOptions&);
  MetricsEndpoint(std::unique_ptr<HttpServer> server, int port);

  std::unique_ptr<HttpServer> server_;
  const int port_;
  std::atomic<bool> loop_ended_{false};
  std::thread thread_;  // cpp-httplib's accept loop
};

// Serves `registry` on http://address/metrics ("host:port" with an IPv4
// host, "localhost" or empty for any; port 0 = ephemeral).
// INVALID_ARGUMENT for a malformed address or options, UNAVAILABLE when it
// cannot listen (e.g. the port is taken).
absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry,
    const MetricsEndpointOptions& options);
inline absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
    const std::string& address,
    std::shared_ptr<prometheus::Registry> registry) {
  return StartMetricsEndpoint(address, std::move(registry),
                              MetricsEndpointOptions());
}

}  // namespace dedit

#endif  // DEDIT_SERVING_METRICS_ENDPOINT_H_
