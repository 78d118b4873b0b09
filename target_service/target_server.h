// dedit-target as a library call: loads the target, starts the model
// thread, the context stream to the drafter, the gRPC server and /metrics,
// and serves until SIGTERM/SIGINT, then drains (ServeUntilSignal,
// common/serving/serve_until_signal.h).
//
//   TargetServerOptions options;       // filled from flags in main.cc
//   options.target_dir = "checkpoints/tiny/target";
//   ExitAfterServing("dedit-target", RunTargetServer(options));
#ifndef DEDIT_TARGET_SERVICE_TARGET_SERVER_H_
#define DEDIT_TARGET_SERVICE_TARGET_SERVER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/serving/internal_auth.h"
#include "common/serving/serve_until_signal.h"
#include "target_service/target_worker.h"

namespace dedit {

struct TargetServerOptions {
  std::string target_dir;
  std::string model_name;  // empty → the target folder's name
  // Context features: the drafter's target_layer_ids, read from
  // `drafter_dir`/config.json unless given explicitly.
  std::string drafter_dir;
  std::vector<int> feature_layer_ids;
  std::string drafter_address;  // host:port of dedit-drafter; empty → none
  // Authentication of this server's port and of the context stream to the
  // drafter (common/serving/internal_auth.h); default: none.
  InternalAuthOptions auth;
  std::string device = "cpu";
  std::string dtype = "float32";
  int cpu_threads = 0;  // libtorch intra-op threads; 0 = default
  // Where to serve (binary and banner are the server's):
  // common/serving/serve_until_signal.h.
  ServeOptions serve = ServeOptionsFor("0.0.0.0", 50051, 9101, "", 10000);
  TargetWorkerOptions worker;
};

// Blocks until a shutdown signal; returns OK once in-flight RPCs have
// drained (up to drain_timeout_ms) and the model thread and the context
// stream are stopped. An error when loading or startup fails.
// REQUIRES: BlockShutdownSignals() was called before any thread started.
absl::Status RunTargetServer(const TargetServerOptions& options);

}  // namespace dedit

#endif  // DEDIT_TARGET_SERVICE_TARGET_SERVER_H_
