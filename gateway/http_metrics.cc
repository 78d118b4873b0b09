#include "gateway/http_metrics.h"

namespace dedit {

HttpMetrics::HttpMetrics(prometheus::Registry& registry)
    : requests_(prometheus::BuildCounter()
                    .Name("dedit_http_requests_total")
                    .Help("HTTP requests answered, by route and status code")
                    .Register(registry)),
      duration_(prometheus::BuildHistogram()
                    .Name("dedit_http_request_duration_seconds")
                    .Help("HTTP request to last byte written (a stream's "
                          "whole life), by route")
                    .Register(registry)),
      generations_running_(prometheus::BuildGauge()
                               .Name("dedit_http_generations_running")
                               .Help("completion requests holding a slot "
                                     "(--max_concurrent_generations)")
                               .Register(registry)
                               .Add({})),
      streams_open_(prometheus::BuildGauge()
                        .Name("dedit_http_streams_open")
                        .Help("SSE streams open (one pool thread each)")
                        .Register(registry)
                        .Add({})),
      disconnects_(prometheus::BuildCounter()
                       .Name("dedit_http_client_disconnects_total")
                       .Help("streams whose client left before the end "
                             "(router call cancelled)")
                       .Register(registry)
                       .Add({})) {}

std::string HttpMetrics::RouteLabel(const std::string& path) {
  for (const char* route : {"/v1/completions", "/v1/chat/completions",
                            "/v1/models", "/health", "/metrics"}) {
    if (path == route) return route;
  }
  return "other";
}

void HttpMetrics::OnResponse(const std::string& route, int status,
                             std::optional<double> seconds) {
  requests_.Add({{"route", route}, {"code", std::to_string(status)}})
      .Increment();
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
      0.5,   1,      2.5,   5,    10,    30,   60,  120};
  if (seconds) duration_.Add({{"route", route}}, kBuckets).Observe(*seconds);
}

void HttpMetrics::OnGenerationStarted(bool stream) {
  generations_running_.Increment();
  if (stream) streams_open_.Increment();
}

void HttpMetrics::OnGenerationFinished(bool stream) {
  generations_running_.Decrement();
  if (stream) streams_open_.Decrement();
}

}  // namespace dedit
