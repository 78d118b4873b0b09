// dedit-router: the public Generation service (docs/ARCHITECTURE.md §3). Runs
// the speculative rounds between dedit-drafter and dedit-target.
//
//   dedit-router --target 127.0.0.1:50051 --drafter 127.0.0.1:50052
//       --tokenizer models/qwen3/tokenizer.json
//       --port 50050 --metrics_port 9100
//   dedit-router --stacks_dns dedit-stack.dedit.svc:50051:50052 ...  # k8s
//   dedit-router --stacks_file stacks.txt ...                       # local
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/engine/speculation_flags.h"
#include "common/engine/speculative_engine.h"
#include "common/serving/service_flags.h"
#include "common/serving/shutdown_signals.h"
#include "router/router_server.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "dedit-target address");
ABSL_FLAG(std::string, drafter, "",
          "dedit-drafter address; empty → target-only decoding");
ABSL_FLAG(std::string, stacks_file, "",
          "file listing the stacks, one `name target_host:port "
          "[drafter_host:port]` per line, re-read when it changes; replaces "
          "--target/--drafter");
ABSL_FLAG(std::string, stacks_dns, "",
          "host:target_port[:drafter_port] of a headless Service: every "
          "address it resolves to is one stack pod; re-resolved every "
          "--stacks_refresh_ms; replaces --target/--drafter");
ABSL_FLAG(int, max_stacks, 64,
          "most stacks --stacks_file / --stacks_dns may list; a longer list "
          "is refused whole (logged) and the last good one kept (each stack "
          "costs a loop thread and channels)");
ABSL_FLAG(int64_t, max_stacks_file_bytes, int64_t{1} << 20,
          "a larger --stacks_file is refused unread (logged), keeping the "
          "last good list");
ABSL_FLAG(int64_t, stacks_refresh_ms, 2000,
          "how often --stacks_file / --stacks_dns are read again");
ABSL_FLAG(int64_t, stack_drain_ms, 30000,
          "a stack that leaves discovery may finish its running requests "
          "this long before they end UNAVAILABLE");
ABSL_FLAG(int, stack_join_threads, 8,
          "stacks joined at once (a join waits for the drafter's first "
          "health probe); a newer list drops the joins still queued");
ABSL_FLAG(int64_t, resume_wait_ms, 60000,
          "a stream whose stack failed it waits this long (or until its "
          "deadline) for a stack to continue it on, e.g. its own target "
          "restarting, before it ends UNAVAILABLE");
ABSL_FLAG(int, max_stream_moves, 8,
          "moves between stacks one request may make before it ends with "
          "its last error");
ABSL_FLAG(std::string, tokenizer, "",
          "tokenizer.json for text/chat prompts and text deltas");
ABSL_FLAG(std::string, model_name, "",
          "served model name (default: the target's)");
ABSL_FLAG(int, port, 50050, "gRPC port (0 = ephemeral)");
ABSL_FLAG(int, metrics_port, 9100, "Prometheus /metrics port (0 = ephemeral)");
ABSL_FLAG(int, max_tokens_limit, 4096, "largest max_tokens a request may ask");
ABSL_FLAG(int64_t, max_prefill_tokens_per_round, int64_t{1} << 20,
          "prompt tokens admitted per round, all sent in one target Step "
          "message (at most 5 bytes each, under the target's "
          "--max_receive_bytes); later requests wait a round");
ABSL_FLAG(int64_t, max_receive_memory_bytes, int64_t{32} << 20,
          "memory gRPC may hold for the public port's connections (a "
          "resource quota): an oversized request is refused without being "
          "buffered whole; keep it well above --max_request_bytes; 0 = "
          "unbounded");
ABSL_FLAG(int, max_request_bytes, 4 << 20,
          "largest request message the public gRPC port accepts");
ABSL_FLAG(int, max_bytes_per_token, 0,
          "text longer than max context x this many bytes is refused before "
          "tokenizing (0 = twice the longest token of the vocabulary)");
ABSL_FLAG(int, max_stop_strings, 16, "most stop strings a request may give");
ABSL_FLAG(int, max_stop_string_bytes, 256,
          "longest stop string a request may give, in bytes");
ABSL_FLAG(int, max_sessions, 256,
          "Generation.Session streams open at once on this router; one more "
          "is RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_session_turns, 1000, "Turns per session");
ABSL_FLAG(double, session_idle_timeout_s, 300,
          "A session with no turn running for this long ends "
          "(DEADLINE_EXCEEDED) and its kept KV cache is released; 0 = never");
ABSL_FLAG(bool, chat_special_tokens_in_content, false,
          "encode special-token text inside chat message content as special "
          "tokens (HF's behaviour; lets a message forge a turn)");
ABSL_FLAG(int, max_passes, 8, "largest K a request may ask");
ABSL_FLAG(int, default_window, 0,
          "W when a request gives none (0 = drafter block size)");
ABSL_FLAG(int, default_passes, 0,
          "K when a request gives none (0 = checkpoint's K)");
ABSL_FLAG(std::string, speculative_method, "model",
          "who drafts when a request does not say: model (the drafter "
          "service), ngram (prompt lookup, no model) or hybrid (per round, "
          "lookup when the recent tokens recur, else the drafter)");
ABSL_FLAG(int, ngram_window, 8, "n-gram method: W when a request gives none");
ABSL_FLAG(int64_t, target_timeout_ms, 60000,
          "deadline of a round's Step on the target");
ABSL_FLAG(bool, round_streams, true,
          "send rounds (Target Step, Drafter Draft) on one long-lived stream "
          "per service instead of a unary call each (docs/SERVICES.md "
          "\"Round streams\")");
ABSL_FLAG(int64_t, draft_timeout_ms, 2000,
          "deadline of Draft calls; slower drafts fall back to target-only");
ABSL_FLAG(int64_t, drafter_probe_ms, 200,
          "health probe interval while the drafter is down");
ABSL_FLAG(int, drain_timeout_ms, 30000, "graceful shutdown: drain time");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the targets' and drafters' certificates must carry when it "
          "is not the host dialled (stacks found by --stacks_dns are "
          "dialled by pod IP)");
ABSL_FLAG(bool, authenticate_clients, false,
          "the public gRPC port requires the internal authentication too "
          "(--internal_token_file and/or --tls_*: the token, or a client "
          "certificate from --tls_ca): for a router whose only client is "
          "dedit-openai beside it, given the same flags");

int main(int argc, char** argv) {
  dedit::BlockShutdownSignals();
  absl::ParseCommandLine(argc, argv);
  dedit::RouterServerOptions o;
  o.target_address = absl::GetFlag(FLAGS_target);
  o.drafter_address = absl::GetFlag(FLAGS_drafter);
  o.stacks.stacks_file = absl::GetFlag(FLAGS_stacks_file);
  o.stacks.stacks_dns = absl::GetFlag(FLAGS_stacks_dns);
  o.stacks.max_stacks = absl::GetFlag(FLAGS_max_stacks);
  o.stacks.max_file_bytes = absl::GetFlag(FLAGS_max_stacks_file_bytes);
  if (o.stacks.max_stacks < 1 || o.stacks.max_file_bytes < 1) {
    std::fprintf(stderr,
                 "dedit-router: --max_stacks and --max_stacks_file_bytes must "
                 "be >= 1\n");
    return 2;
  }
  o.stacks_refresh_ms = absl::GetFlag(FLAGS_stacks_refresh_ms);
  o.stack_drain_ms = absl::GetFlag(FLAGS_stack_drain_ms);
  o.stack_join_threads = absl::GetFlag(FLAGS_stack_join_threads);
  if (o.stack_join_threads < 1 || o.stack_join_threads > 64) {
    std::fprintf(stderr,
                 "dedit-router: --stack_join_threads must be in [1, 64]\n");
    return 2;
  }
  o.resume_wait_ms = absl::GetFlag(FLAGS_resume_wait_ms);
  o.max_stream_moves = absl::GetFlag(FLAGS_max_stream_moves);
  if (o.resume_wait_ms < 0 || o.max_stream_moves < 0) {
    std::fprintf(stderr,
                 "dedit-router: --resume_wait_ms and --max_stream_moves must "
                 "be >= 0\n");
    return 2;
  }
  if (!o.stacks.stacks_file.empty() || !o.stacks.stacks_dns.empty()) {
    if (absl::Status s = dedit::StackDiscovery::Validate(o.stacks); !s.ok()) {
      std::fprintf(stderr, "dedit-router: %s\n",
                   std::string(s.message()).c_str());
      return 2;
    }
  }
  if (o.stacks_refresh_ms < 10) {
    std::fprintf(stderr, "dedit-router: --stacks_refresh_ms must be >= 10\n");
    return 2;
  }
  o.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  const dedit::ServiceFlags service = dedit::ReadServiceFlags(
      absl::GetFlag(FLAGS_port), absl::GetFlag(FLAGS_metrics_port),
      absl::GetFlag(FLAGS_drain_timeout_ms));
  o.serve = service.serve;
  o.auth = service.auth;
  o.loop.model_name = absl::GetFlag(FLAGS_model_name);
  o.loop.max_tokens_limit = absl::GetFlag(FLAGS_max_tokens_limit);
  o.loop.max_passes = absl::GetFlag(FLAGS_max_passes);
  o.loop.max_prefill_tokens_per_round =
      absl::GetFlag(FLAGS_max_prefill_tokens_per_round);
  if (o.loop.max_prefill_tokens_per_round < 1) {
    std::fprintf(stderr,
                 "dedit-router: --max_prefill_tokens_per_round must be >= 1\n");
    return 2;
  }
  o.defaults.max_tokens_limit = o.loop.max_tokens_limit;
  o.defaults.max_passes = o.loop.max_passes;
  o.serve.max_receive_message_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  o.serve.receive_memory_bytes = absl::GetFlag(FLAGS_max_receive_memory_bytes);
  if (o.serve.receive_memory_bytes != 0 &&
      o.serve.receive_memory_bytes <
          2 * int64_t{o.serve.max_receive_message_bytes}) {
    std::fprintf(stderr,
                 "dedit-router: --max_receive_memory_bytes must be 0 or at "
                 "least twice --max_request_bytes\n");
    return 2;
  }
  o.defaults.max_bytes_per_token = absl::GetFlag(FLAGS_max_bytes_per_token);
  o.defaults.max_stop_strings = absl::GetFlag(FLAGS_max_stop_strings);
  o.defaults.max_stop_string_bytes = absl::GetFlag(FLAGS_max_stop_string_bytes);
  o.defaults.sessions.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  o.defaults.sessions.max_turns = absl::GetFlag(FLAGS_max_session_turns);
  o.defaults.sessions.idle_timeout_ms = static_cast<int64_t>(
      absl::GetFlag(FLAGS_session_idle_timeout_s) * 1000.0);
  o.defaults.chat_special_tokens_in_content =
      absl::GetFlag(FLAGS_chat_special_tokens_in_content);
  o.defaults.default_window = absl::GetFlag(FLAGS_default_window);
  o.defaults.default_passes = absl::GetFlag(FLAGS_default_passes);
  const std::string method = absl::GetFlag(FLAGS_speculative_method);
  if (!dedit::DraftMethodFromName(method, &o.defaults.default_method)) {
    std::fprintf(stderr,
                 "dedit-router: --speculative_method must be model, ngram or "
                 "hybrid, got '%s'\n",
                 method.c_str());
    return 2;
  }
  if (auto speculation = dedit::SpeculationOptionsFromFlags();
      speculation.ok()) {
    o.loop.speculation = *speculation;
  } else {
    std::fprintf(stderr, "dedit-router: %s\n",
                 std::string(speculation.status().message()).c_str());
    return 2;
  }
  o.defaults.ngram_max_window = o.loop.speculation.ngram.max_window;
  o.defaults.ngram_default_window = absl::GetFlag(FLAGS_ngram_window);
  if (o.defaults.ngram_default_window < 1 ||
      o.defaults.ngram_default_window > o.loop.speculation.ngram.max_window) {
    std::fprintf(stderr,
                 "dedit-router: --ngram_window must be in [1, "
                 "--ngram_max_window]\n");
    return 2;
  }
  o.auth.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  o.authenticate_clients = absl::GetFlag(FLAGS_authenticate_clients);
  o.verifier.rpc_timeout_ms = absl::GetFlag(FLAGS_target_timeout_ms);
  o.drafter.draft_timeout_ms = absl::GetFlag(FLAGS_draft_timeout_ms);
  o.verifier.round_streams = absl::GetFlag(FLAGS_round_streams);
  o.drafter.round_streams = absl::GetFlag(FLAGS_round_streams);
  o.drafter.probe_interval_ms = absl::GetFlag(FLAGS_drafter_probe_ms);
  dedit::ExitAfterServing("dedit-router", dedit::RunRouterServer(o));
}
