// dedit-drafter: the DEdit drafter service (docs/ARCHITECTURE.md §3).
//
//   dedit-drafter --drafter_dir checkpoints/tiny/drafter
//       --target_dir checkpoints/tiny/target
//       --port 50052 --metrics_port 9102 --device cpu
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "drafter_service/drafter_server.h"
#include "model/cpu_flags.h"
#include "serving/shutdown_signals.h"

ABSL_FLAG(std::string, drafter_dir, "", "DEdit/DFlash drafter folder");
ABSL_FLAG(std::string, target_dir, "",
          "target folder (its embed_tokens and lm_head are shared)");
ABSL_FLAG(std::string, model_name, "", "served name (default: folder name)");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda, cuda:N");
ABSL_FLAG(std::string, dtype, "float32", "compute dtype: float32 or bfloat16");
ABSL_FLAG(int, threads, 0,
          "CPU compute threads: libtorch's and the weight-product pool's (0 = "
          "the machine's cores; model/cpu_flags.h)");
ABSL_FLAG(bool, causal_editor, false, "force the causal editor (ablation)");
ABSL_FLAG(std::string, host, "0.0.0.0", "listen host");
ABSL_FLAG(int, port, 50052, "gRPC port (0 = ephemeral)");
ABSL_FLAG(int, metrics_port, 9102, "Prometheus /metrics port (0 = ephemeral)");
ABSL_FLAG(std::string, ready_file, "",
          "written with the bound ports once serving");
ABSL_FLAG(int64_t, max_batch_wait_us, 0,
          "wait this long for more Draft RPCs before drafting (one router "
          "already batches its sequences into one call; raise it when "
          "several routers share the drafter)");
ABSL_FLAG(int64_t, idle_spin_us, 0,
          "after each forward, poll this long for the next call before "
          "sleeping: saves a thread wake-up per round, costs a core while "
          "idle (base/spin_wait.h)");
ABSL_FLAG(int64_t, context_wait_ms, 500,
          "how long a draft waits for context that has not arrived");
ABSL_FLAG(int, max_passes, 8, "largest K served");
ABSL_FLAG(int, max_batch_sequences, 256,
          "draft items per batched forward (0 = all ready); shared "
          "round-robin across callers, so one caller's flood cannot starve "
          "the others");
ABSL_FLAG(int, drain_timeout_ms, 5000, "graceful shutdown: drain time");
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
  dedit::DrafterServerOptions o;
  o.drafter_dir = absl::GetFlag(FLAGS_drafter_dir);
  o.target_dir = absl::GetFlag(FLAGS_target_dir);
  if (o.drafter_dir.empty() || o.target_dir.empty()) {
    std::fprintf(
        stderr, "dedit-drafter: --drafter_dir and --target_dir are required\n");
    return 2;
  }
  o.model_name = absl::GetFlag(FLAGS_model_name);
  o.device = absl::GetFlag(FLAGS_device);
  o.dtype = absl::GetFlag(FLAGS_dtype);
  o.cpu_threads = absl::GetFlag(FLAGS_threads);
  if (const absl::Status s = dedit::ApplyCpuKernelFlags(o.cpu_threads);
      !s.ok()) {
    std::fprintf(stderr, "dedit-drafter: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  // What "auto" resolved to, for the operator's log.
  std::fprintf(stderr, "dedit-drafter: %s\n",
               dedit::CpuKernelSummary().c_str());
  if (absl::GetFlag(FLAGS_causal_editor)) o.causal_editor = true;
  o.serve = dedit::ServeOptionsFor(
      absl::GetFlag(FLAGS_host), absl::GetFlag(FLAGS_port),
      absl::GetFlag(FLAGS_metrics_port), absl::GetFlag(FLAGS_ready_file),
      absl::GetFlag(FLAGS_drain_timeout_ms));
  const int health_port = absl::GetFlag(FLAGS_health_port);
  if (health_port < -1 || health_port > 65535) {
    std::fprintf(
        stderr, "dedit-drafter: --health_port must be -1 (none) or 0..65535\n");
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
  o.worker.max_batch_wait_us = absl::GetFlag(FLAGS_max_batch_wait_us);
  o.worker.context_wait_ms = absl::GetFlag(FLAGS_context_wait_ms);
  o.worker.idle_spin_us = absl::GetFlag(FLAGS_idle_spin_us);
  o.worker.max_passes = absl::GetFlag(FLAGS_max_passes);
  o.worker.max_batch_sequences = absl::GetFlag(FLAGS_max_batch_sequences);
  if (o.worker.max_batch_sequences < 0) {
    std::fprintf(stderr, "dedit-drafter: --max_batch_sequences must be >= 0\n");
    return 2;
  }
  dedit::ExitAfterServing("dedit-drafter", dedit::RunDrafterServer(o));
}
