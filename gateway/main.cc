// dedit-openai: the OpenAI-compatible HTTP front of dedit-router
// (gateway/openai_server.h).
//
//   dedit-openai --router 127.0.0.1:50050 --port 8000
//   curl localhost:8000/v1/completions -d '{"prompt": "Hi", "max_tokens": 8}'
//
// Its calls to the router authenticate with the internal flags
// (common/serving/internal_auth_flags.h: --internal_token_file, --tls_cert,
// --tls_key, --tls_ca, --tls_refresh_s) when the router requires them
// (dedit-router --authenticate_clients).
#include <algorithm>
#include <csignal>
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/serving/internal_auth_flags.h"
#include "common/serving/shutdown_signals.h"
#include "gateway/openai_server.h"

ABSL_FLAG(std::string, router, "127.0.0.1:50050", "dedit-router address");
ABSL_FLAG(std::string, tls_server_name, "",
          "with --tls_*: the name the router's certificate must carry, when "
          "it is not the host of --router");
ABSL_FLAG(std::string, host, "0.0.0.0", "listen host");
ABSL_FLAG(int, port, 8000, "HTTP port: the API and /metrics (0 = ephemeral)");
ABSL_FLAG(std::string, ready_file, "",
          "written with the bound port once serving");
ABSL_FLAG(int, io_threads, 2,
          "threads for every connection's I/O (event-driven: a slow, idle or "
          "streaming connection holds none)");
ABSL_FLAG(int, max_concurrent_generations, 48,
          "completion requests running at once (one pool thread each); more "
          "get 429");
ABSL_FLAG(int64_t, max_body_bytes, 1 << 20,
          "largest request body, whatever its framing; larger ones get 413");
ABSL_FLAG(int, header_timeout_ms, 10000,
          "the request line and header must arrive within this (from the "
          "accept, or a later request's first byte); else 408 and close");
ABSL_FLAG(int, body_timeout_ms, 30000,
          "the whole body must arrive within this after the header; else 408 "
          "and close");
ABSL_FLAG(int64_t, max_request_line_bytes, 8192,
          "longest request line; longer gets 414");
ABSL_FLAG(int64_t, max_header_bytes, 16384,
          "largest request line plus header fields; larger gets 431");
ABSL_FLAG(int, max_headers, 100, "most header fields; more get 431");
ABSL_FLAG(int, max_connections, 1024,
          "open connections in total; more get 503 and are closed");
ABSL_FLAG(int, max_connections_per_client, 32,
          "open connections per client IP address; more get 429 and are "
          "closed");
ABSL_FLAG(int64_t, request_timeout_ms, 600000,
          "deadline of each completion request (its Generate call)");
ABSL_FLAG(int, sse_heartbeat_ms, 1000,
          "SSE comment after this long without tokens (finds clients that "
          "left)");
ABSL_FLAG(int, keep_alive_timeout_s, 5,
          "idle keep-alive connections close after this long");
ABSL_FLAG(int, write_timeout_s, 30,
          "a write to a client that does not read closes the connection (and "
          "cancels its generation) after this long");
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
  o.router_auth = dedit::InternalAuthOptionsFromFlags();
  o.router_auth.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.ready_file = absl::GetFlag(FLAGS_ready_file);
  o.max_concurrent_generations =
      absl::GetFlag(FLAGS_max_concurrent_generations);
  o.request_timeout_ms = absl::GetFlag(FLAGS_request_timeout_ms);
  o.sse_heartbeat_ms = absl::GetFlag(FLAGS_sse_heartbeat_ms);
  o.default_chat_max_tokens = absl::GetFlag(FLAGS_default_chat_max_tokens);
  o.drain_timeout_ms = absl::GetFlag(FLAGS_drain_timeout_ms);
  o.http.host = absl::GetFlag(FLAGS_host);
  o.http.port = absl::GetFlag(FLAGS_port);
  o.http.io_threads = absl::GetFlag(FLAGS_io_threads);
  dedit::HttpLimits& l = o.http.limits;
  l.header_timeout_ms = absl::GetFlag(FLAGS_header_timeout_ms);
  l.body_timeout_ms = absl::GetFlag(FLAGS_body_timeout_ms);
  l.keep_alive_timeout_s = absl::GetFlag(FLAGS_keep_alive_timeout_s);
  l.write_timeout_s = absl::GetFlag(FLAGS_write_timeout_s);
  // A negative size reads as 0, which the validation refuses.
  l.max_request_line_bytes = static_cast<size_t>(
      std::max<int64_t>(0, absl::GetFlag(FLAGS_max_request_line_bytes)));
  l.max_header_bytes = static_cast<size_t>(
      std::max<int64_t>(0, absl::GetFlag(FLAGS_max_header_bytes)));
  l.max_headers = absl::GetFlag(FLAGS_max_headers);
  l.max_body_bytes = static_cast<size_t>(
      std::max<int64_t>(0, absl::GetFlag(FLAGS_max_body_bytes)));
  l.max_connections = absl::GetFlag(FLAGS_max_connections);
  l.max_connections_per_client =
      absl::GetFlag(FLAGS_max_connections_per_client);
  dedit::ExitAfterServing("dedit-openai", dedit::RunOpenAiServer(o));
}
