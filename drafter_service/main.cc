// dedit-drafter: the DEdit drafter service (docs/ARCHITECTURE.md §3).
//
//   dedit-drafter --drafter_dir checkpoints/tiny/drafter
//       --target_dir checkpoints/tiny/target
//       --port 50052 --metrics_port 9102 --device cpu
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/model/cpu/cpu_flags.h"
#include "common/serving/model_service_flags.h"
#include "common/serving/shutdown_signals.h"
#include "drafter_service/drafter_server.h"

ABSL_FLAG(std::string, drafter_dir, "", "DEdit/DFlash drafter folder");
ABSL_FLAG(std::string, target_dir, "",
          "target folder (its embed_tokens and lm_head are shared)");
ABSL_FLAG(std::string, model_name, "", "served name (default: folder name)");
ABSL_FLAG(bool, causal_editor, false, "force the causal editor (ablation)");
ABSL_FLAG(int, port, 50052, "gRPC port (0 = ephemeral)");
ABSL_FLAG(int, metrics_port, 9102, "Prometheus /metrics port (0 = ephemeral)");
ABSL_FLAG(int64_t, max_batch_wait_us, 0,
          "wait this long for more Draft RPCs before drafting (one router "
          "already batches its sequences into one call; raise it when "
          "several routers share the drafter)");
ABSL_FLAG(int64_t, idle_spin_us, 0,
          "after each forward, poll this long for the next call before "
          "sleeping: saves a thread wake-up per round, costs a core while "
          "idle (common/base/spin_wait.h)");
ABSL_FLAG(int64_t, park_idle_ms, 2000,
          "a sequence neither fed nor drafted for this long (a session "
          "between turns) moves out of the KV pool's slots into a copy of "
          "its own tokens; 0 = never");
ABSL_FLAG(int64_t, context_wait_ms, 500,
          "how long a draft waits for context that has not arrived");
ABSL_FLAG(int, max_passes, 8, "largest K served");
ABSL_FLAG(int, max_batch_sequences, 256,
          "draft items per batched forward (0 = all ready); shared "
          "round-robin across callers, so one caller's flood cannot starve "
          "the others");
ABSL_FLAG(int, drain_timeout_ms, 5000, "graceful shutdown: drain time");

int main(int argc, char** argv) {
  dedit::BlockShutdownSignals();
  absl::ParseCommandLine(argc, argv);
  dedit::DrafterServerOptions o;
  o.drafter_dir = absl::GetFlag(FLAGS_drafter_dir);
  o.target_dir = absl::GetFlag(FLAGS_target_dir);
  if (o.drafter_dir.empty() || o.target_dir.empty()) {
    std::fprintf(
        stderr, "dedit-drafter: --drafter_dir and --target_dir are required\n");
    return 2;
  }
  o.model_name = absl::GetFlag(FLAGS_model_name);
  const absl::StatusOr<dedit::ModelServiceFlags> service =
      dedit::ReadModelServiceFlags(absl::GetFlag(FLAGS_port),
                                   absl::GetFlag(FLAGS_metrics_port),
                                   absl::GetFlag(FLAGS_drain_timeout_ms));
  if (!service.ok()) {
    std::fprintf(stderr, "dedit-drafter: %s\n",
                 std::string(service.status().message()).c_str());
    return 2;
  }
  // What "auto" resolved to, for the operator's log.
  std::fprintf(stderr, "dedit-drafter: %s\n",
               dedit::CpuKernelSummary().c_str());
  o.device = service->device;
  o.dtype = service->dtype;
  o.cpu_threads = service->cpu_threads;
  o.serve = service->serve;
  o.auth = service->auth;
  if (absl::GetFlag(FLAGS_causal_editor)) o.causal_editor = true;
  o.worker.max_batch_wait_us = absl::GetFlag(FLAGS_max_batch_wait_us);
  o.worker.context_wait_ms = absl::GetFlag(FLAGS_context_wait_ms);
  o.worker.idle_spin_us = absl::GetFlag(FLAGS_idle_spin_us);
  o.worker.max_passes = absl::GetFlag(FLAGS_max_passes);
  o.worker.park_idle_ms = absl::GetFlag(FLAGS_park_idle_ms);
  o.worker.max_batch_sequences = absl::GetFlag(FLAGS_max_batch_sequences);
  if (o.worker.max_batch_sequences < 0) {
    std::fprintf(stderr, "dedit-drafter: --max_batch_sequences must be >= 0\n");
    return 2;
  }
  dedit::ExitAfterServing("dedit-drafter", dedit::RunDrafterServer(o));
}
