#include "drafter_service/drafter_server.h"

#include <ATen/Parallel.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/model_config.h"
#include "common/base/status.h"
#include "common/model/cpu/cpu_threads.h"
#include "common/model/dedit_drafter.h"
#include "common/model/qwen3_model.h"
#include "common/model/tensor_io.h"
#include "common/serving/internal_auth.h"
#include "common/serving/serve_until_signal.h"
#include "common/serving/server_bootstrap.h"
#include "common/serving/service_readiness.h"
#include "drafter_service/drafter_service.h"

namespace dedit {
namespace {

constexpr char kReadinessService[] = "dedit.v1.Drafter";

// docs/ARCHITECTURE.md §4, drafter side.
class DrafterMetrics {
 public:
  DrafterMetrics(prometheus::Registry& r, int max_passes)
      : pass_family_(
            prometheus::BuildHistogram()
                .Name("dedit_drafter_pass_duration_seconds")
                .Help("Wall time of one drafting pass (P1..PK) over a batch")
                .Register(r)),
        batch_size_(prometheus::BuildHistogram()
                        .Name("dedit_drafter_batch_size")
                        .Help("Sequences per batched Draft call")
                        .Register(r)
                        .Add({},
                             prometheus::Histogram::BucketBoundaries{
                                 1, 2, 4, 8, 16, 32, 64, 128, 256})),
        context_tokens_(prometheus::BuildGauge()
                            .Name("dedit_drafter_context_tokens")
                            .Help("Context tokens cached over all sequences")
                            .Register(r)
                            .Add({})),
        sequences_(prometheus::BuildGauge()
                       .Name("dedit_drafter_sequences")
                       .Help("Sequences with context on the drafter")
                       .Register(r)
                       .Add({})),
        waits_(prometheus::BuildHistogram()
                   .Name("dedit_drafter_draft_wait_seconds")
                   .Help("Time a Draft call waited before its forward, by "
                         "cause: queue (the model thread was busy) or context "
                         "(its features were still on the target's stream)")
                   .Register(r)),
        queue_wait_(waits_.Add({{"cause", "queue"}}, WaitBuckets())),
        context_wait_(waits_.Add({{"cause", "context"}}, WaitBuckets())),
        orphaned_(prometheus::BuildCounter()
                      .Name("dedit_drafter_contexts_orphaned_total")
                      .Help("Contexts dropped because the context stream "
                            "that fed them ended")
                      .Register(r)
                      .Add({})) {
    for (int k = 1; k <= max_passes; ++k) {
      passes_.push_back(&pass_family_.Add(
          {{"pass", std::to_string(k)}},
          prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005,
                                                  0.01, 0.025, 0.05, 0.1, 0.25,
                                                  0.5, 1, 2.5}));
    }
  }

  // On the model thread only (the snapshot listener).
  void SetSnapshot(const DrafterWorker::Snapshot& s) {
    context_tokens_.Set(static_cast<double>(s.context_tokens));
    sequences_.Set(s.num_sequences);
    if (s.orphaned_contexts > orphaned_seen_) {
      orphaned_.Increment(
          static_cast<double>(s.orphaned_contexts - orphaned_seen_));
      orphaned_seen_ = s.orphaned_contexts;
    }
  }

  void Observe(const DrafterBatchStats& s) {
    batch_size_.Observe(s.sequences);
    for (double w : s.queue_wait_seconds) queue_wait_.Observe(w);
    for (double w : s.context_wait_seconds) context_wait_.Observe(w);
    // DEditDrafter::Draft runs all passes in one call; every pass does the
    // same work (same block, same context), so each is attributed an equal
    // share of the call. (A per-pass hook in DEditDrafter would make this
    // exact.)
    const int k = std::min<int>(s.max_passes, static_cast<int>(passes_.size()));
    for (int i = 0; i < k; ++i) passes_[i]->Observe(s.seconds / s.max_passes);
  }

 private:
  // From 10 µs: on one stream a round's whole hop can take well under a
  // millisecond, so the short waits need buckets of their own.
  static prometheus::Histogram::BucketBoundaries WaitBuckets() {
    return {1e-5,   2.5e-5, 5e-5, 1e-4,  2.5e-4, 5e-4, 1e-3,
            2.5e-3, 5e-3,   0.01, 0.025, 0.1,    0.5};
  }

  prometheus::Family<prometheus::Histogram>& pass_family_;
  prometheus::Histogram& batch_size_;
  prometheus::Gauge& context_tokens_;
  prometheus::Gauge& sequences_;
  prometheus::Family<prometheus::Histogram>& waits_;
  prometheus::Histogram& queue_wait_;
  prometheus::Histogram& context_wait_;
  prometheus::Counter& orphaned_;
  int64_t orphaned_seen_ = 0;
  std::vector<prometheus::Histogram*> passes_;
};

}  // namespace

absl::Status RunDrafterServer(const DrafterServerOptions& options) {
  ASSIGN_OR_RETURN(InternalAuth auth, InternalAuth::Load(options.auth));
  SetCpuThreads(options.cpu_threads);
  ASSIGN_OR_RETURN(c10::Device device, ParseDevice(options.device));
  ASSIGN_OR_RETURN(at::ScalarType dtype, ParseScalarType(options.dtype));
  ASSIGN_OR_RETURN(Qwen3Config target_config,
                   LoadQwen3Config(options.target_dir));
  ASSIGN_OR_RETURN(DrafterConfig drafter_config,
                   LoadDrafterConfig(options.drafter_dir));
  RETURN_IF_ERROR(CheckDrafterMatchesTarget(drafter_config, target_config));
  at::Tensor embed_tokens, lm_head;
  RETURN_IF_ERROR(LoadTargetEmbeddings(options.target_dir, dtype, device,
                                       &embed_tokens, &lm_head));
  DEditDrafter::Options drafter_options;
  drafter_options.device = device;
  drafter_options.dtype = dtype;
  drafter_options.max_context_tokens = target_config.max_position_embeddings;
  ASSIGN_OR_RETURN(std::unique_ptr<DEditDrafter> drafter,
                   DEditDrafter::Load(options.drafter_dir, embed_tokens,
                                      lm_head, drafter_options));
  if (options.causal_editor) drafter->set_causal_editor(*options.causal_editor);
  // The largest message this port needs is one context chunk of the whole
  // context (float32 at worst; the target sends bf16) plus framing, so a
  // larger one is refused before it is read.
  const int64_t chunk_bytes = target_config.max_position_embeddings *
                                  int64_t{drafter->feature_width()} * 4 +
                              (int64_t{1} << 20);
  std::string model_name = options.model_name;
  if (model_name.empty()) {
    model_name = std::filesystem::path(options.drafter_dir).filename().string();
  }

  auto registry = std::make_shared<prometheus::Registry>();
  DrafterMetrics metrics(*registry, options.worker.max_passes);
  // Health (docs/ARCHITECTURE.md, "Health"): "" turns SERVING after the
  // warm-up, dedit.v1.Drafter also needs an attached context stream
  // (drafter_service.h); both NOT_SERVING for good on a sticky device
  // error. Declared before the worker, whose thread may set it.
  ServiceReadiness readiness(kReadinessService);
  DrafterWorkerOptions worker_options = options.worker;
  worker_options.cpu_threads = options.cpu_threads;
  DrafterWorker worker(
      std::move(drafter),
      [&metrics](const DrafterBatchStats& s) { metrics.Observe(s); },
      worker_options);
  // After every pass, releases included (not only after drafts).
  worker.SetSnapshotListener(
      [&metrics](const DrafterWorker::Snapshot& s) { metrics.SetSnapshot(s); });
  worker.SetPoisonListener([&readiness](const absl::Status& poisoned) {
    std::fprintf(stderr, "dedit-drafter: %s; health NOT_SERVING\n",
                 poisoned.ToString().c_str());
    readiness.SetPoisoned();
  });
  worker.Start();

  DrafterServiceImpl service(
      &worker, {model_name, options.device},
      [&readiness](int streams) { readiness.Set(streams > 0); }, nullptr);
  ServeOptions serve = options.serve;
  serve.binary = "dedit-drafter";
  serve.banner = absl::StrCat(model_name, " on ", options.device, ", block ",
                              drafter_config.block_size,
                              ", internal calls: ", auth.Describe());
  serve.credentials = auth.ServerCredentials();
  serve.readiness = &readiness;
  if (serve.max_receive_message_bytes == 0) {
    serve.max_receive_message_bytes =
        static_cast<int>(std::min<int64_t>(chunk_bytes, kMaxMessageBytes));
  }
  ServeHooks hooks;
  hooks.warm_up = [&worker] { return worker.AwaitWarmUp(); };
  // Context streams never end on their own: finish them so that they do
  // not hold the drain to its deadline (the target reconnects).
  hooks.before_drain = [&service] { service.FinishStreams(); };
  hooks.after_drain = [&worker] { worker.Stop(); };
  return ServeUntilSignal(serve, {&service}, registry, hooks);
}

}  // namespace dedit
