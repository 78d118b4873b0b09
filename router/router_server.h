// dedit-router as a library call: connects to its stacks (one
// dedit-target + dedit-drafter pair each, router/stack_set.h: from
// --target/--drafter, a stacks file or a headless Service's DNS name), runs
// one GenerationLoop per stack and serves dedit.v1.Generation, health,
// reflection and /metrics until SIGTERM/SIGINT, then drains
// (ServeUntilSignal, common/serving/serve_until_signal.h).
//
//   RouterServerOptions options;      // filled from flags in main.cc
//   options.target_address = "127.0.0.1:50051";
//   options.drafter_address = "127.0.0.1:50052";
//   // or: options.stacks.stacks_dns = "dedit-stack:50051:50052";
//   ExitAfterServing("dedit-router", RunRouterServer(options));
#ifndef DEDIT_ROUTER_ROUTER_SERVER_H_
#define DEDIT_ROUTER_ROUTER_SERVER_H_

#include <string>

#include "absl/status/status.h"
#include "common/serving/internal_auth.h"
#include "common/serving/serve_until_signal.h"
#include "router/generation_loop.h"
#include "router/generation_service.h"
#include "router/remote_drafter.h"
#include "router/remote_verifier.h"
#include "router/stack_discovery.h"

namespace dedit {

struct RouterServerOptions {
  std::string target_address = "127.0.0.1:50051";
  std::string drafter_address;  // empty → target-only router
  // When set (one of the two), the stacks come from here and
  // target_address/drafter_address are not used.
  StackDiscovery::Source stacks;
  int64_t stacks_refresh_ms = 2000;
  int64_t stack_drain_ms = 30000;  // StackSet::Options
  int stack_join_threads = 8;      // StackSet::Options::join_threads
  int64_t resume_wait_ms = 60000;  // StackSet::Options
  int max_stream_moves = 8;        // StackSet::Options::max_moves
  // How often readiness (dedit.v1.Generation: some stack reachable) is
  // refreshed.
  int64_t readiness_poll_ms = 200;
  std::string tokenizer_path;  // empty → token ids only
  // Where to serve (binary and banner are the server's):
  // common/serving/serve_until_signal.h.
  ServeOptions serve = ServeOptionsFor("0.0.0.0", 50050, 9100, "", 30000);
  // How the router authenticates to the stacks' targets and drafters
  // (common/serving/internal_auth.h: --internal_token_file, --tls_*); its own
  // public port stays open unless authenticate_clients.
  InternalAuthOptions auth;
  // The public port takes only calls with the same authentication (the
  // gateway's hop); INVALID_ARGUMENT without any auth flag.
  bool authenticate_clients = false;
  GenerationLoop::Options loop;
  GenerationServiceImpl::Defaults defaults;
  RemoteVerifier::Options verifier;
  RemoteDrafter::Options drafter;
};

// Blocks until a shutdown signal; returns OK once running streams have
// finished or were cancelled at drain_timeout_ms, and the generation loop
// and the drafter prober are stopped. An error when startup fails.
// REQUIRES: BlockShutdownSignals() was called before any thread started.
absl::Status RunRouterServer(const RouterServerOptions& options);

}  // namespace dedit

#endif  // DEDIT_ROUTER_ROUTER_SERVER_H_
