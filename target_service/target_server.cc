#include "target_service/target_server.h"

#include <ATen/Parallel.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/base/model_config.h"
#include "common/base/status.h"
#include "common/model/cpu/cpu_threads.h"
#include "common/model/qwen3_model.h"
#include "common/model/tensor_io.h"
#include "common/serving/internal_auth.h"
#include "common/serving/serve_until_signal.h"
#include "common/serving/server_bootstrap.h"
#include "common/serving/service_readiness.h"
#include "target_service/context_stream_client.h"
#include "target_service/target_service.h"

namespace dedit {
namespace {

constexpr char kReadinessService[] = "dedit.v1.Target";

// docs/ARCHITECTURE.md §4, target side.
struct TargetMetrics {
  explicit TargetMetrics(prometheus::Registry& r)
      : batch_size(prometheus::BuildHistogram()
                       .Name("dedit_target_batch_size")
                       .Help("Sequences (prefill chunks + verify blocks) per "
                             "target forward")
                       .Register(r)
                       .Add({},
                            prometheus::Histogram::BucketBoundaries{
                                1, 2, 4, 8, 16, 32, 64, 128, 256})),
        forward_seconds(prometheus::BuildHistogram()
                            .Name("dedit_target_forward_duration_seconds")
                            .Help("Wall time of one batched target forward")
                            .Register(r)
                            .Add({},
                                 prometheus::Histogram::BucketBoundaries{
                                     0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                     0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10})),
        kv_usage(prometheus::BuildGauge()
                     .Name("dedit_kv_cache_usage_ratio")
                     .Help("Cached KV tokens / KV capacity in tokens")
                     .Register(r)
                     .Add({})),
        stream_bytes(prometheus::BuildCounter()
                         .Name("dedit_context_stream_bytes_total")
                         .Help("Bytes of context features sent to the drafter")
                         .Register(r)
                         .Add({})),
        idle_sequences(prometheus::BuildGauge()
                           .Name("dedit_target_idle_sequences")
                           .Help("Sequences kept between session turns")
                           .Register(r)
                           .Add({})),
        evicted(prometheus::BuildCounter()
                    .Name("dedit_target_sequences_evicted_total")
                    .Help("Idle session sequences evicted to make room for "
                          "a prompt")
                    .Register(r)
                    .Add({})),
        sequences(prometheus::BuildGauge()
                      .Name("dedit_target_sequences")
                      .Help("Sequences held (KV cached or being prefilled)")
                      .Register(r)
                      .Add({})),
        reserved_tokens(prometheus::BuildGauge()
                            .Name("dedit_target_reserved_tokens")
                            .Help("KV tokens reserved by admitted sequences")
                            .Register(r)
                            .Add({})),
        expired(prometheus::BuildCounter()
                    .Name("dedit_target_sequences_expired_total")
                    .Help("Sequences released because no call renewed their "
                          "lease (--sequence_lease_seconds)")
                    .Register(r)
                    .Add({})),
        kv_bytes_family(prometheus::BuildGauge()
                            .Name("dedit_target_kv_bytes")
                            .Help("KV cache bytes: in_use, what the cached "
                                  "tokens take; held, what the pool holds "
                                  "for them (slack and parked sessions "
                                  "included)")
                            .Register(r)),
        kv_bytes_in_use(kv_bytes_family.Add({{"state", "in_use"}})),
        kv_bytes_held(kv_bytes_family.Add({{"state", "held"}})) {}
  prometheus::Histogram& batch_size;
  prometheus::Histogram& forward_seconds;
  prometheus::Gauge& kv_usage;
  prometheus::Counter& stream_bytes;
  prometheus::Gauge& idle_sequences;
  prometheus::Counter& evicted;
  prometheus::Gauge& sequences;
  prometheus::Gauge& reserved_tokens;
  prometheus::Counter& expired;
  prometheus::Family<prometheus::Gauge>& kv_bytes_family;
  prometheus::Gauge& kv_bytes_in_use;
  prometheus::Gauge& kv_bytes_held;
};

}  // namespace

absl::Status RunTargetServer(const TargetServerOptions& options) {
  ASSIGN_OR_RETURN(InternalAuth auth, InternalAuth::Load(options.auth));
  SetCpuThreads(options.cpu_threads);
  ASSIGN_OR_RETURN(c10::Device device, ParseDevice(options.device));
  ASSIGN_OR_RETURN(at::ScalarType dtype, ParseScalarType(options.dtype));
  Qwen3Model::Options model_options;
  model_options.device = device;
  model_options.dtype = dtype;
  model_options.feature_layer_ids = options.feature_layer_ids;
  if (model_options.feature_layer_ids.empty() && !options.drafter_dir.empty()) {
    ASSIGN_OR_RETURN(DrafterConfig drafter,
                     LoadDrafterConfig(options.drafter_dir));
    model_options.feature_layer_ids = drafter.target_layer_ids;
  }
  if (!options.drafter_address.empty() &&
      model_options.feature_layer_ids.empty()) {
    return absl::InvalidArgumentError(
        "a drafter needs context features: pass --drafter_dir or "
        "--feature_layer_ids");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Qwen3Model> model,
                   Qwen3Model::Load(options.target_dir, model_options));
  std::string model_name = options.model_name;
  if (model_name.empty()) {
    model_name = std::filesystem::path(options.target_dir).filename().string();
    if (model_name.empty()) {
      model_name = std::filesystem::path(options.target_dir)
                       .parent_path()
                       .filename()
                       .string();
    }
  }

  auto registry = std::make_shared<prometheus::Registry>();
  TargetMetrics metrics(*registry);

  std::unique_ptr<ContextStreamClient> stream;
  if (!options.drafter_address.empty()) {
    stream = std::make_unique<ContextStreamClient>(
        auth.Channel(options.drafter_address, InternalChannelArguments()),
        ContextStreamClient::Options(), [&metrics](int64_t bytes) {
          metrics.stream_bytes.Increment(static_cast<double>(bytes));
        });
    stream->Start();
  }
  // Health: "" and dedit.v1.Target turn SERVING after the warm-up and
  // NOT_SERVING for good on a sticky device error (docs/ARCHITECTURE.md,
  // "Health"). Declared before the worker, whose thread may set it.
  ServiceReadiness readiness(kReadinessService, /*ready=*/true);
  TargetWorkerOptions worker_options = options.worker;
  worker_options.cpu_threads = options.cpu_threads;
  TargetWorker worker(
      std::move(model), stream.get(),
      [&metrics](const TargetForwardStats& s) {
        metrics.batch_size.Observe(s.segments);
        metrics.forward_seconds.Observe(s.seconds);
      },
      worker_options);
  // After every step, releases included (not only after forwards).
  // Runs on the model thread only, so `expired_seen` needs no lock.
  worker.SetSnapshotListener(
      [&metrics, expired_seen = int64_t{0},
       evicted_seen = int64_t{0}](const TargetWorker::Snapshot& s) mutable {
        metrics.sequences.Set(s.num_sequences);
        metrics.reserved_tokens.Set(static_cast<double>(s.reserved_tokens));
        if (s.expired_sequences > expired_seen) {
          metrics.expired.Increment(
              static_cast<double>(s.expired_sequences - expired_seen));
          expired_seen = s.expired_sequences;
        }
        if (s.kv_capacity_tokens > 0) {
          metrics.kv_usage.Set(static_cast<double>(s.cached_tokens) /
                               static_cast<double>(s.kv_capacity_tokens));
        }
        metrics.idle_sequences.Set(s.idle_sequences);
        metrics.kv_bytes_in_use.Set(static_cast<double>(s.kv_bytes_in_use));
        metrics.kv_bytes_held.Set(static_cast<double>(s.kv_bytes_held));
        if (s.evicted_sequences > evicted_seen) {
          metrics.evicted.Increment(
              static_cast<double>(s.evicted_sequences - evicted_seen));
          evicted_seen = s.evicted_sequences;
        }
      });
  worker.SetPoisonListener([&readiness](const absl::Status& poisoned) {
    std::fprintf(stderr, "dedit-target: %s; health NOT_SERVING\n",
                 poisoned.ToString().c_str());
    readiness.SetPoisoned();
  });
  worker.Start();

  TargetServiceImpl service(&worker, stream.get(),
                            {model_name, options.device, options.dtype});
  ServeOptions serve = options.serve;
  serve.binary = "dedit-target";
  serve.banner = absl::StrCat("model ", model_name, " on ", options.device,
                              ", internal calls: ", auth.Describe());
  serve.credentials = auth.ServerCredentials();
  serve.readiness = &readiness;
  ServeHooks hooks;
  hooks.warm_up = [&worker] { return worker.AwaitWarmUp(); };
  hooks.before_drain = [&service] { service.DrainRounds(); };
  hooks.after_drain = [&] {
    worker.Stop();
    if (stream) stream->Stop(1000);
  };
  return ServeUntilSignal(serve, {&service}, registry, hooks);
}

}  // namespace dedit
