// dedit-target: the target model service (docs/ARCHITECTURE.md §3).
//
//   dedit-target --target_dir checkpoints/tiny/target
//       --drafter_dir checkpoints/tiny/drafter --drafter 127.0.0.1:50052
//       --port 50051 --metrics_port 9101 --device cpu
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/model/cpu/cpu_flags.h"
#include "common/serving/model_service_flags.h"
#include "common/serving/shutdown_signals.h"
#include "target_service/target_server.h"

ABSL_FLAG(std::string, target_dir, "", "target model folder (HF format)");
ABSL_FLAG(std::string, model_name, "",
          "served model name (default: folder name)");
ABSL_FLAG(std::string, drafter_dir, "",
          "drafter folder, read for its target_layer_ids (context features)");
ABSL_FLAG(std::string, feature_layer_ids, "",
          "comma-separated target layers for context features (overrides "
          "--drafter_dir)");
ABSL_FLAG(std::string, drafter, "",
          "dedit-drafter address host:port; empty → none");
ABSL_FLAG(int, port, 50051, "gRPC port (0 = ephemeral)");
ABSL_FLAG(int, metrics_port, 9101, "Prometheus /metrics port (0 = ephemeral)");
ABSL_FLAG(int, max_batch_tokens, 2048, "tokens per batched forward");
ABSL_FLAG(int64_t, max_batch_wait_us, 2000,
          "how long a forward waits for the other half of a round "
          "(Prefill + Verify sent together)");
ABSL_FLAG(int64_t, idle_spin_us, 0,
          "after each step, poll this long for the next call before "
          "sleeping: saves a thread wake-up per round, costs a core while "
          "idle (common/base/spin_wait.h)");
ABSL_FLAG(int64_t, kv_capacity_tokens, 262144,
          "KV capacity in tokens (admission control)");
ABSL_FLAG(double, sequence_lease_seconds, 60,
          "release a sequence no call has named for this long (a crashed "
          "router's); every round and KeepAlive renews it; 0 = never");
ABSL_FLAG(int, max_receive_bytes, 64 << 20,
          "largest gRPC message accepted (routers' Step calls carry a "
          "round's prompts: keep above 5 x their "
          "--max_prefill_tokens_per_round + the verify blocks)");
ABSL_FLAG(int, drain_timeout_ms, 10000, "graceful shutdown: drain time");

int main(int argc, char** argv) {
  dedit::BlockShutdownSignals();
  absl::ParseCommandLine(argc, argv);
  dedit::TargetServerOptions o;
  o.target_dir = absl::GetFlag(FLAGS_target_dir);
  if (o.target_dir.empty()) {
    std::fprintf(stderr, "dedit-target: --target_dir is required\n");
    return 2;
  }
  o.model_name = absl::GetFlag(FLAGS_model_name);
  o.drafter_dir = absl::GetFlag(FLAGS_drafter_dir);
  for (absl::string_view part : absl::StrSplit(
           absl::GetFlag(FLAGS_feature_layer_ids), ',', absl::SkipEmpty())) {
    int id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      std::fprintf(stderr, "dedit-target: bad --feature_layer_ids\n");
      return 2;
    }
    o.feature_layer_ids.push_back(id);
  }
  o.drafter_address = absl::GetFlag(FLAGS_drafter);
  const absl::StatusOr<dedit::ModelServiceFlags> service =
      dedit::ReadModelServiceFlags(absl::GetFlag(FLAGS_port),
                                   absl::GetFlag(FLAGS_metrics_port),
                                   absl::GetFlag(FLAGS_drain_timeout_ms));
  if (!service.ok()) {
    std::fprintf(stderr, "dedit-target: %s\n",
                 std::string(service.status().message()).c_str());
    return 2;
  }
  // What "auto" resolved to, for the operator's log.
  std::fprintf(stderr, "dedit-target: %s\n", dedit::CpuKernelSummary().c_str());
  o.device = service->device;
  o.dtype = service->dtype;
  o.cpu_threads = service->cpu_threads;
  o.serve = service->serve;
  o.auth = service->auth;
  o.worker.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  o.worker.max_batch_wait_us = absl::GetFlag(FLAGS_max_batch_wait_us);
  o.worker.kv_capacity_tokens = absl::GetFlag(FLAGS_kv_capacity_tokens);
  o.worker.idle_spin_us = absl::GetFlag(FLAGS_idle_spin_us);
  o.serve.max_receive_message_bytes = absl::GetFlag(FLAGS_max_receive_bytes);
  if (o.serve.max_receive_message_bytes < (1 << 20)) {
    std::fprintf(stderr,
                 "dedit-target: --max_receive_bytes must be >= 1 MiB\n");
    return 2;
  }
  const double lease = absl::GetFlag(FLAGS_sequence_lease_seconds);
  if (!(lease >= 0 && lease <= 86400)) {
    std::fprintf(stderr,
                 "dedit-target: --sequence_lease_seconds must be in "
                 "[0, 86400]\n");
    return 2;
  }
  o.worker.sequence_lease = absl::Seconds(lease);
  dedit::ExitAfterServing("dedit-target", dedit::RunTargetServer(o));
}
