// The gateway's Prometheus metrics (docs/ARCHITECTURE.md §4, "HTTP front"),
// served on its own /metrics next to the API. The router's metrics
// (requests, tokens, acceptance) count the same requests as gRPC calls;
// these add what only the HTTP side sees: status codes, whole-request
// latency, open SSE streams, refusals and client disconnects.
//
// Thread-safe (prometheus-cpp metrics are).
#ifndef DEDIT_GATEWAY_HTTP_METRICS_H_
#define DEDIT_GATEWAY_HTTP_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <optional>
#include <string>

namespace dedit {

class HttpMetrics {
 public:
  explicit HttpMetrics(prometheus::Registry& registry);

  // A response was written completely (for a stream: after its last
  // event). `route` is one of the served paths or "other"; `seconds` is
  // unknown for requests the HTTP server refused before routing (limits,
  // framing, connection counts).
  void OnResponse(const std::string& route, int status,
                  std::optional<double> seconds);
  void OnGenerationStarted(bool stream);
  void OnGenerationFinished(bool stream);
  // A stream's client went away before the end; the router call was
  // cancelled.
  void OnClientDisconnect() { disconnects_.Increment(); }

  // The label for a request path (bounded cardinality).
  static std::string RouteLabel(const std::string& path);

 private:
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Gauge& generations_running_;
  prometheus::Gauge& streams_open_;
  prometheus::Counter& disconnects_;
};

}  // namespace dedit

#endif  // DEDIT_GATEWAY_HTTP_METRICS_H_
