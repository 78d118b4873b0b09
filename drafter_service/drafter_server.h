// dedit-drafter as a library call: loads the drafter (and the target's
// embedding/lm_head, which it shares), starts the model thread, the gRPC
// server and /metrics, and serves until SIGTERM/SIGINT, then drains
// (ServeUntilSignal, common/serving/serve_until_signal.h).
//
//   DrafterServerOptions options;     // filled from flags in main.cc
//   options.drafter_dir = "checkpoints/tiny/drafter";
//   options.target_dir = "checkpoints/tiny/target";
//   ExitAfterServing("dedit-drafter", RunDrafterServer(options));
#ifndef DEDIT_DRAFTER_SERVICE_DRAFTER_SERVER_H_
#define DEDIT_DRAFTER_SERVICE_DRAFTER_SERVER_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/serving/internal_auth.h"
#include "common/serving/serve_until_signal.h"
#include "drafter_service/drafter_worker.h"

namespace dedit {

struct DrafterServerOptions {
  std::string drafter_dir;
  std::string target_dir;  // for embed_tokens / lm_head only
  std::string model_name;  // empty → the drafter folder's name
  std::string device = "cpu";
  std::string dtype = "float32";
  int cpu_threads = 0;
  std::optional<bool> causal_editor;
  // Authentication of this server's port (common/serving/internal_auth.h);
  // default: none.
  InternalAuthOptions auth;
  // Where to serve (binary and banner are the server's):
  // common/serving/serve_until_signal.h.
  ServeOptions serve = ServeOptionsFor("0.0.0.0", 50052, 9102, "", 5000);
  DrafterWorkerOptions worker;
};

// Blocks until a shutdown signal; returns OK once the context streams are
// finished, in-flight RPCs have drained (up to drain_timeout_ms) and the
// model thread is stopped. An error when loading or startup fails.
// REQUIRES: BlockShutdownSignals() was called before any thread started.
absl::Status RunDrafterServer(const DrafterServerOptions& options);

}  // namespace dedit

#endif  // DEDIT_DRAFTER_SERVICE_DRAFTER_SERVER_H_
