#include "router/router_server.h"

#include <memory>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/base/status.h"
#include "common/serving/serve_until_signal.h"
#include "common/serving/server_bootstrap.h"
#include "common/serving/service_readiness.h"
#include "common/tokenizer/tokenizer.h"

namespace dedit {

absl::Status RunRouterServer(const RouterServerOptions& options) {
  ASSIGN_OR_RETURN(InternalAuth auth, InternalAuth::Load(options.auth));
  if (options.authenticate_clients && !auth.token() && !auth.tls()) {
    return absl::InvalidArgumentError(
        "--authenticate_clients needs --internal_token_file or --tls_cert, "
        "--tls_key and --tls_ca");
  }
  std::unique_ptr<Tokenizer> tokenizer;
  if (!options.tokenizer_path.empty()) {
    ASSIGN_OR_RETURN(tokenizer, Tokenizer::FromFile(options.tokenizer_path));
  }
  auto registry = std::make_shared<prometheus::Registry>();
  StackSet::Options stack_options;
  stack_options.loop = options.loop;
  stack_options.verifier = options.verifier;
  stack_options.drafter = options.drafter;
  stack_options.stack_drain_ms = options.stack_drain_ms;
  stack_options.join_threads = options.stack_join_threads;
  stack_options.resume_wait_ms = options.resume_wait_ms;
  stack_options.max_moves = options.max_stream_moves;
  stack_options.auth = auth;
  StackSet stacks(tokenizer.get(), registry, stack_options);
  std::unique_ptr<StackDiscovery> discovery;
  const bool discovered =
      !options.stacks.stacks_file.empty() || !options.stacks.stacks_dns.empty();
  if (discovered) {
    RETURN_IF_ERROR(StackDiscovery::Validate(options.stacks));
    discovery = std::make_unique<StackDiscovery>(
        options.stacks, options.stacks_refresh_ms,
        [&stacks](const std::vector<StackAddress>& list) {
          stacks.Update(list);
        });
    discovery->Start();
  } else {
    // One stack; named by its target, as a discovered one is by its IP.
    stacks.Update({{options.target_address, options.target_address,
                    options.drafter_address}});
  }
  GenerationServiceImpl service(&stacks, tokenizer.get(), options.defaults,
                                registry.get());
  ServeOptions serve = options.serve;
  serve.binary = "dedit-router";
  serve.banner =
      !options.stacks.stacks_dns.empty()
          ? absl::StrCat("stacks from DNS ", options.stacks.stacks_dns)
      : !options.stacks.stacks_file.empty()
          ? absl::StrCat("stacks from ", options.stacks.stacks_file)
          : absl::StrCat("target ", options.target_address, ", drafter ",
                         options.drafter_address.empty()
                             ? "(none)"
                             : options.drafter_address);
  absl::StrAppend(&serve.banner, ", internal calls: ", auth.Describe());
  if (options.authenticate_clients) {
    // The public port too: only the gateway (or a client given the same
    // files) gets in. Health stays open for the probes.
    serve.credentials = auth.ServerCredentials();
    absl::StrAppend(&serve.banner, ", clients: ", auth.Describe());
  }
  // Readiness (docs/ARCHITECTURE.md, "Health"): the named service
  // dedit.v1.Generation is SERVING while some stack takes new requests, so
  // that Kubernetes stops sending clients to a router that can reach no
  // stack; "" (liveness) stays SERVING while the process serves.
  ServiceReadiness readiness("dedit.v1.Generation");
  serve.readiness = &readiness;
  absl::Notification stop_readiness;
  std::thread readiness_thread([&] {
    do {
      bool any = false;
      for (const StackState& s : stacks.Stacks()) any = any || s.reachable;
      readiness.Set(any);
    } while (!stop_readiness.WaitForNotificationWithTimeout(
        absl::Milliseconds(options.readiness_poll_ms)));
  });
  absl::Cleanup join_readiness = [&] {
    stop_readiness.Notify();
    readiness_thread.join();
  };
  ServeHooks hooks;
  // Running streams finish during the drain, or are cancelled at its
  // deadline, which the loop turns into CANCELLED + Release.
  hooks.after_drain = [&] {
    if (discovery) discovery->Stop();
    stacks.Stop();
  };
  return ServeUntilSignal(serve, {&service}, registry, hooks);
}

}  // namespace dedit
