// dedit-openai: an OpenAI-compatible HTTP front for dedit-router. Each
// completion request becomes one dedit.v1.Generation/Generate call to the
// router, so validation, scheduling and the SpeculativeEngine path are the
// gRPC ones; the gateway translates (openai_request.h, openai_response.h)
// and streams. Routes: POST /v1/completions, POST /v1/chat/completions,
// GET /v1/models, GET /health, GET /metrics.
//
//   OpenAiServerOptions options;
//   options.router_address = "127.0.0.1:50050";
//   options.port = 8000;
//   return RunOpenAiServer(options);   // until SIGTERM, then drains
//
// Threads: cpp-httplib serves each connection on one thread of a fixed pool
// (--http_threads) for the connection's whole life: an SSE stream holds its
// thread until the last event, and an idle keep-alive connection holds one
// for up to --keep_alive_timeout_s. So at most --max_concurrent_generations
// completion requests run at once (the rest get 429 at once, not a queue),
// and the pool must be larger by a margin for /health, /metrics, /v1/models,
// refusals and idle keep-alive connections: startup refuses
// http_threads < max_concurrent_generations + 4.
#ifndef DEDIT_GATEWAY_OPENAI_SERVER_H_
#define DEDIT_GATEWAY_OPENAI_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace dedit {

struct OpenAiServerOptions {
  std::string router_address = "127.0.0.1:50050";
  std::string host = "0.0.0.0";
  int port = 8000;         // 0 = ephemeral
  std::string ready_file;  // {"grpc_port": 0, "metrics_port": <port>}
  int http_threads = 64;
  int max_concurrent_generations = 48;
  size_t max_body_bytes = 1 << 20;  // larger bodies get 400
  // Deadline of every Generate call (and so of every completion request).
  int64_t request_timeout_ms = 600000;
  // A stream with nothing to send for this long gets an SSE comment, so a
  // client that left is noticed (and its router call cancelled) even while
  // the router is quiet.
  int sse_heartbeat_ms = 1000;
  int keep_alive_timeout_s = 5;
  int read_timeout_s = 30;
  int write_timeout_s = 30;
  int default_chat_max_tokens = 512;  // chat requests without max_tokens
  // After SIGTERM: running requests may finish for this long, then their
  // router calls are cancelled.
  int drain_timeout_ms = 30000;
};

// INVALID_ARGUMENT for inconsistent options.
absl::Status ValidateOpenAiServerOptions(const OpenAiServerOptions& options);

// Serves until SIGTERM or SIGINT, then drains: /health turns 503, new
// completion requests get 503, running ones finish (or are cancelled at the
// drain deadline), the listener closes. OK after the drain; UNAVAILABLE when
// the port cannot be bound.
// REQUIRES: BlockShutdownSignals() ran before any thread started.
absl::Status RunOpenAiServer(const OpenAiServerOptions& options);

}  // namespace dedit

#endif  // DEDIT_GATEWAY_OPENAI_SERVER_H_
