#include "router/router_server.h"

#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "serving/serve_until_signal.h"
#include "serving/server_bootstrap.h"
#include "tokenizer/tokenizer.h"

namespace dedit {

absl::Status RunRouterServer(const RouterServerOptions& options) {
  std::unique_ptr<Tokenizer> tokenizer;
  if (!options.tokenizer_path.empty()) {
    ASSIGN_OR_RETURN(tokenizer, Tokenizer::FromFile(options.tokenizer_path));
  }
  // Distinguishes this router's sequences in the shared services.
  std::random_device random;
  uint32_t nonce = 0;
  while (nonce == 0) nonce = random();

  const grpc::ChannelArguments args = InternalChannelArguments();
  RemoteVerifier verifier(
      grpc::CreateCustomChannel(options.target_address,
                                grpc::InsecureChannelCredentials(), args),
      options.verifier, nonce);
  std::unique_ptr<RemoteDrafter> drafter;
  if (!options.drafter_address.empty()) {
    drafter = std::make_unique<RemoteDrafter>(
        grpc::CreateCustomChannel(options.drafter_address,
                                  grpc::InsecureChannelCredentials(), args),
        options.drafter, nonce);
    drafter->Start();
  }
  auto registry = std::make_shared<prometheus::Registry>();
  GenerationLoop loop({&verifier, &verifier, drafter.get(), drafter.get()},
                      tokenizer.get(), registry, options.loop);
  loop.Start();
  GenerationServiceImpl service(&loop, drafter.get(), tokenizer.get(),
                                options.defaults);
  ServeOptions serve = options.serve;
  serve.binary = "dedit-router";
  serve.banner = absl::StrCat(
      "target ", options.target_address, ", drafter ",
      options.drafter_address.empty() ? "(none)" : options.drafter_address);
  ServeHooks hooks;
  // Running streams finish during the drain, or are cancelled at its
  // deadline, which the loop turns into CANCELLED + Release.
  hooks.after_drain = [&] {
    loop.Stop();
    if (drafter) drafter->Stop();
  };
  return ServeUntilSignal(serve, {&service}, registry, hooks);
}

}  // namespace dedit
