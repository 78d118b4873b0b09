// dedit-openai: the OpenAI-compatible HTTP front of dedit-router
// (gateway/openai_server.h).
//
//   dedit-openai --router 127.0.0.1:50050 --port 8000
//   curl localhost:8000/v1/completions -d '{"prompt": "Hi", "max_tokens": 8}'
#include <csignal>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/serving/shutdown_signals.h"
#include "gateway/openai_server.h"

ABSL_FLAG(std::string, router, "127.0.0.1:50050", "dedit-router address");
ABSL_FLAG(std::string, host, "0.0.0.0", "listen host");
ABSL_FLAG(int, port, 8000, "HTTP port: the API and /metrics (0 = ephemeral)");
ABSL_FLAG(std::string, ready_file, "",
          "written with the bound port once serving");
ABSL_FLAG(int, http_threads, 64,
          "HTTP worker pool; each open connection (an SSE stream, an idle "
          "keep-alive connection) holds one thread");
ABSL_FLAG(int, max_concurrent_generations, 48,
          "completion requests running at once; more get 429. At most "
          "--http_threads - 4");
ABSL_FLAG(int64_t, max_body_bytes, 1 << 20,
          "largest request body; larger ones get 400");
ABSL_FLAG(int64_t, request_timeout_ms, 600000,
          "deadline of each completion request (its Generate call)");
ABSL_FLAG(int, sse_heartbeat_ms, 1000,
          "SSE comment after this long without tokens (finds clients that "
          "left)");
ABSL_FLAG(int, keep_alive_timeout_s, 5,
          "idle keep-alive connections close after this long");
ABSL_FLAG(int, read_timeout_s, 30, "socket read timeout");
ABSL_FLAG(int, write_timeout_s, 30, "socket write timeout (slow clients)");
ABSL_FLAG(int, default_chat_max_tokens, 512,
          "max_tokens of a chat request that gives none (completions: 16)");
ABSL_FLAG(int, drain_timeout_ms, 30000,
          "SIGTERM: running requests may finish for this long");

int main(int argc, char** argv) {
  dedit::BlockShutdownSignals();
  // A write to a client that left must fail with EPIPE, not kill us.
  std::signal(SIGPIPE, SIG_IGN);
  absl::ParseCommandLine(argc, argv);
  dedit::OpenAiServerOptions o;
  o.router_address = absl::GetFlag(FLAGS_router);
  o.host = absl::GetFlag(FLAGS_host);
  o.port = absl::GetFlag(FLAGS_port);
  o.ready_file = absl::GetFlag(FLAGS_ready_file);
  o.http_threads = absl::GetFlag(FLAGS_http_threads);
  o.max_concurrent_generations =
      absl::GetFlag(FLAGS_max_concurrent_generations);
  o.max_body_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_max_body_bytes));
  o.request_timeout_ms = absl::GetFlag(FLAGS_request_timeout_ms);
  o.sse_heartbeat_ms = absl::GetFlag(FLAGS_sse_heartbeat_ms);
  o.keep_alive_timeout_s = absl::GetFlag(FLAGS_keep_alive_timeout_s);
  o.read_timeout_s = absl::GetFlag(FLAGS_read_timeout_s);
  o.write_timeout_s = absl::GetFlag(FLAGS_write_timeout_s);
  o.default_chat_max_tokens = absl::GetFlag(FLAGS_default_chat_max_tokens);
  o.drain_timeout_ms = absl::GetFlag(FLAGS_drain_timeout_ms);
  dedit::ExitAfterServing("dedit-openai", dedit::RunOpenAiServer(o));
}
