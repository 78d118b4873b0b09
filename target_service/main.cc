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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "model/cpu_flags.h"
#include "serving/shutdown_signals.h"
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
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda, cuda:N");
ABSL_FLAG(std::string, dtype, "float32", "compute dtype: float32 or bfloat16");
ABSL_FLAG(int, threads, 0,
          "CPU compute threads: libtorch's and the weight-product pool's (0 = "
          "the machine's cores; model/cpu_flags.h)");
ABSL_FLAG(std::string, host, "0.0.0.0", "listen host");
ABSL_FLAG(int, port, 50051, "gRPC port (0 = ephemeral)");
ABSL_FLAG(int, metrics_port, 9101, "Prometheus /metrics port (0 = ephemeral)");
ABSL_FLAG(std::string, ready_file, "",
          "written with the bound ports once serving");
ABSL_FLAG(int, max_batch_tokens, 2048, "tokens per batched forward");
ABSL_FLAG(int64_t, max_batch_wait_us, 2000,
          "how long a forward waits for the other half of a round "
          "(Prefill + Verify sent together)");
ABSL_FLAG(int64_t, idle_spin_us, 0,
          "after each step, poll this long for the next call before "
          "sleeping: saves a thread wake-up per round, costs a core while "
          "idle (base/spin_wait.h)");
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
ABSL_FLAG(std::string, internal_token_file, "",
          "file holding the shared token internal calls must carry "
          "(loopback only; see docs/SERVICES.md, \"Internal authentication\")");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of this process: mTLS on the gRPC port "
          "and to its peers; with --tls_key and --tls_ca");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s) that every peer's certificate chains to");
ABSL_FLAG(int, health_port, -1,
          "plaintext port serving grpc.health.v1 only, for probes that "
          "cannot speak TLS (0 = ephemeral, -1 = none)");

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
  o.device = absl::GetFlag(FLAGS_device);
  o.dtype = absl::GetFlag(FLAGS_dtype);
  o.cpu_threads = absl::GetFlag(FLAGS_threads);
  if (const absl::Status s = dedit::ApplyCpuKernelFlags(o.cpu_threads);
      !s.ok()) {
    std::fprintf(stderr, "dedit-target: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  // What "auto" resolved to, for the operator's log.
  std::fprintf(stderr, "dedit-target: %s\n", dedit::CpuKernelSummary().c_str());
  o.serve = dedit::ServeOptionsFor(
      absl::GetFlag(FLAGS_host), absl::GetFlag(FLAGS_port),
      absl::GetFlag(FLAGS_metrics_port), absl::GetFlag(FLAGS_ready_file),
      absl::GetFlag(FLAGS_drain_timeout_ms));
  const int health_port = absl::GetFlag(FLAGS_health_port);
  if (health_port < -1 || health_port > 65535) {
    std::fprintf(stderr,
                 "dedit-target: --health_port must be -1 (none) or 0..65535\n");
    return 2;
  }
  if (health_port >= 0) {
    o.serve.health_listen_address =
        absl::StrCat(absl::GetFlag(FLAGS_host), ":", health_port);
  }
  o.auth.token_file = absl::GetFlag(FLAGS_internal_token_file);
  o.auth.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.auth.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.auth.tls_ca = absl::GetFlag(FLAGS_tls_ca);
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
