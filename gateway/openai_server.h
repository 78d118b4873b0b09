// dedit-openai: an OpenAI-compatible HTTP front for dedit-router. Each
// completion request becomes one dedit.v1.Generation/Generate call to the
// router, so validation, scheduling and the SpeculativeEngine path are the
// gRPC ones; the gateway translates (openai_request.h, openai_response.h)
// and streams. Routes: POST /v1/completions, POST /v1/chat/completions,
// GET /v1/models, GET /health, GET /metrics.
//
//   OpenAiServerOptions options;
//   options.router_address = "127.0.0.1:50050";
//   options.http.port = 8000;
//   return RunOpenAiServer(options);   // until SIGTERM, then drains
//
// Threads: the HTTP side (gateway/http_server.h) is event-driven on
// --io_threads, which never block: a slow, idle or streaming connection
// holds no thread, and /metrics is answered there. A completion request
// runs on a pool of --max_concurrent_generations threads, taking its slot
// before it leaves the io thread (one more gets 429 at once, not a queue);
// /health and /v1/models ask the router asynchronously. So no number of
// connections, streams or refusals can starve /health or /metrics.
#ifndef DEDIT_GATEWAY_OPENAI_SERVER_H_
#define DEDIT_GATEWAY_OPENAI_SERVER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/serving/internal_auth.h"
#include "gateway/http_server.h"

namespace dedit {

struct OpenAiServerOptions {
  std::string router_address = "127.0.0.1:50050";
  // How the calls to the router authenticate (common/serving/
  // internal_auth.h: the internal flags, for a router started with
  // --authenticate_clients); default: plaintext.
  InternalAuthOptions router_auth;
  // Address, io threads and the limits every connection is held to (an
  // oversized body gets 413).
  HttpServerOptions http;
  std::string ready_file;  // {"grpc_port": 0, "metrics_port": <port>}
  int max_concurrent_generations = 48;
  // Deadline of every Generate call (and so of every completion request).
  int64_t request_timeout_ms = 600000;
  // A stream with nothing to send for this long gets an SSE comment, so a
  // client that stopped reading is found (and its router call cancelled)
  // even while the router is quiet.
  int sse_heartbeat_ms = 1000;
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
// the port cannot be bound; InternalAuth::Load's error for bad auth files.
// REQUIRES: BlockShutdownSignals() ran before any thread started.
absl::Status RunOpenAiServer(const OpenAiServerOptions& options);

}  // namespace dedit

#endif  // DEDIT_GATEWAY_OPENAI_SERVER_H_
