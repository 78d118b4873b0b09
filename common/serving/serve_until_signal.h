// The serve sequence every dedit binary runs once its service is built:
// gRPC with health and reflection, /metrics, the model's warm-up, health
// SERVING and the ready file, then SIGTERM or SIGINT → NOT_SERVING → drain
// with a deadline → stop the workers.
//
//   ServeOptions serve;                  // from the binary's options
//   serve.binary = "dedit-target";
//   serve.banner = "model tiny on cpu";
//   serve.listen_address = "0.0.0.0:50051";
//   serve.readiness = &readiness;        // service_readiness.h
//   ServeHooks hooks;
//   hooks.warm_up = [&] { return worker.AwaitWarmUp(); };
//   hooks.after_drain = [&] { worker.Stop(); };
//   return ServeUntilSignal(serve, {&service}, registry, hooks);
//
// The binary's main() then ends with ExitAfterServing (shutdown_signals.h).
#ifndef DEDIT_SERVING_SERVE_UNTIL_SIGNAL_H_
#define DEDIT_SERVING_SERVE_UNTIL_SIGNAL_H_

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dedit {

class ServiceReadiness;

struct ServeOptions {
  std::string binary;           // log prefix, e.g. "dedit-target"
  std::string banner;           // what is served; logged with the ports
  std::string listen_address;   // gRPC "host:port"; port 0 = ephemeral
  std::string metrics_address;  // /metrics "host:port"; port 0 = ephemeral
  std::string ready_file;       // empty → none
  // How long in-flight RPCs may run after the signal before gRPC cancels
  // them.
  int drain_timeout_ms = 10000;
  // Largest gRPC message the server accepts; 0 = kMaxMessageBytes
  // (server_bootstrap.h), which internal ports need for feature blocks. A
  // public port sets it small (the router's --max_request_bytes).
  int max_receive_message_bytes = 0;
  // Memory gRPC may hold for the server's connections (StartGrpcServer's
  // receive_memory_bytes); 0 = unbounded. The router's public port sets it
  // (--max_receive_memory_bytes).
  int64_t receive_memory_bytes = 0;
  // Credentials of the gRPC port; null = plaintext for anyone. The model
  // services pass InternalAuth::ServerCredentials() (internal_auth.h).
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // "host:port" of a second, plaintext port that serves grpc.health.v1 only,
  // with the same statuses (port 0 = ephemeral; empty = none): Kubernetes'
  // gRPC probes cannot speak TLS (StartHealthServer, server_bootstrap.h).
  std::string health_listen_address;
  // The named health service and the overall status "" of a model
  // service, which the binary sets from its own threads
  // (service_readiness.h); published from the start, marked warmed up
  // after the warm_up hook, detached before the drain and on every early
  // return. Not owned; null (the router) → "" turns SERVING after the
  // warm_up hook and stays so until the drain.
  ServiceReadiness* readiness = nullptr;
};

// The endpoints every binary takes from its --host, --port, --metrics_port,
// --ready_file and --drain_timeout_ms flags; binary and banner are left to
// the server.
ServeOptions ServeOptionsFor(const std::string& host, int port,
                             int metrics_port, std::string ready_file,
                             int drain_timeout_ms);

// What a binary adds to the startup and the shutdown. Every hook is
// optional and runs on the thread that called ServeUntilSignal.
struct ServeHooks {
  // Once the server and /metrics are up (health NOT_SERVING): blocks until
  // the model ran its warm-up forward (ModelThread::AwaitWarmUp). Health
  // turns SERVING only after it returned OK; an error is returned from
  // ServeUntilSignal, so the binary exits non-zero and never serves.
  std::function<absl::Status()> warm_up;
  // After the signal, once every health service reports NOT_SERVING and
  // before the drain starts: end what would otherwise hold the drain to
  // its deadline (the drafter finishes its context streams here).
  std::function<void()> before_drain;
  // The drain is over (every RPC finished or was cancelled): stop the
  // threads the RPCs fed — model workers, stream writers, probers.
  std::function<void()> after_drain;
};

// Serves `services` on options.listen_address and `registry` on
// options.metrics_address until SIGTERM or SIGINT, then drains:
//   1. gRPC server with health (every status NOT_SERVING) and reflection,
//      and the health port when asked for; readiness published to both
//   2. /metrics endpoint
//   3. warm_up; then readiness.SetWarmedUp() (or "" SERVING without one)
//   4. ready file with the bound ports; "<binary>: <banner>, gRPC port N,
//      metrics port M[, health port H]" on stderr
//   5. wait for SIGTERM/SIGINT; "<binary>: signal S, draining" (a signal
//      during the warm-up is taken here, after it)
//   6. readiness detached; health NOT_SERVING (every service name);
//      before_drain
//   7. Shutdown with deadline now + drain_timeout_ms: new calls are
//      refused, running ones finish or are cancelled at the deadline
//   8. after_drain; /metrics, the server and the health port are torn
//      down
// Returns OK after the drain. A failure in steps 1-4 is returned at once
// (UNAVAILABLE when a port cannot be bound, INVALID_ARGUMENT for a bad
// metrics address, the warm-up's error prefixed "warm-up failed: ", the
// file-system error naming the ready file when it cannot be written, e.g.
// NOT_FOUND), and neither before_drain nor after_drain runs: the caller's
// own objects stop their threads as they are destroyed.
// REQUIRES: BlockShutdownSignals() ran before any thread started, and no
// other thread waits for the shutdown signals.
absl::Status ServeUntilSignal(const ServeOptions& options,
                              const std::vector<grpc::Service*>& services,
                              std::shared_ptr<prometheus::Registry> registry,
                              const ServeHooks& hooks);

}  // namespace dedit

#endif  // DEDIT_SERVING_SERVE_UNTIL_SIGNAL_H_
