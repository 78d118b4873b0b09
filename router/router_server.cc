#include "router/router_server.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>

#include "base/status.h"
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
  ASSIGN_OR_RETURN(StartedServer server,
                   StartGrpcServer(options.listen_address, {&service}));
  ASSIGN_OR_RETURN(std::unique_ptr<MetricsEndpoint> metrics_endpoint,
                   StartMetricsEndpoint(options.metrics_address, registry));
  RETURN_IF_ERROR(WriteReadyFile(options.ready_file, server.port,
                                 metrics_endpoint->port()));
  std::fprintf(stderr,
               "dedit-router: target %s, drafter %s, gRPC port %d, metrics port %d\n",
               options.target_address.c_str(),
               options.drafter_address.empty() ? "(none)"
                                               : options.drafter_address.c_str(),
               server.port, metrics_endpoint->port());

  const int sig = WaitForShutdownSignal();
  std::fprintf(stderr, "dedit-router: signal %d, draining\n", sig);
  // New calls are refused; running streams finish (or are cancelled at
  // the deadline, which the loop turns into CANCELLED + Release).
  server.server->GetHealthCheckService()->SetServingStatus(false);
  server.server->Shutdown(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(options.drain_timeout_ms));
  loop.Stop();
  if (drafter) drafter->Stop();
  return absl::OkStatus();
}

}  // namespace dedit
