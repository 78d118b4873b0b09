// In-process implementations of the round interfaces over the models.
//
//   LocalDrafter drafter(dedit_drafter.get());
//   LocalVerifier verifier(target.get(), &drafter);  // streams features
//   SpeculativeEngine engine(&verifier, &drafter, options);
#ifndef DEDIT_MODEL_LOCAL_BACKENDS_H_
#define DEDIT_MODEL_LOCAL_BACKENDS_H_

#include <memory>
#include <unordered_map>
#include <vector>

#include "common/engine/round_interfaces.h"
#include "common/model/context_sink.h"
#include "common/model/dedit_drafter.h"
#include "common/model/qwen3_model.h"
#include "common/model/sampling.h"

namespace dedit {

// Target side over a Qwen3Model. Prefill and verify blocks run in one packed
// forward; then common/model/verify_commit.h accepts, truncates the cache to
// the committed length and hands the committed rows' features to `sink` (may be
// null) — the same step the target service runs.
class LocalVerifier : public Verifier {
 public:
  LocalVerifier(Qwen3Model* model, ContextSink* sink)
      : model_(model), sink_(sink) {}

  absl::StatusOr<TargetStepResult> Step(
      const std::vector<PrefillWork>& prefills,
      const std::vector<VerifyWork>& verifies) override;
  absl::Status Release(SequenceId sequence) override;

 private:
  Qwen3Model* model_;
  ContextSink* sink_;
  struct Sequence {
    std::unique_ptr<TokenSampler> sampler;
    bool context = true;  // PrefillWork::context: fed to sink_
  };
  std::unordered_map<SequenceId, Sequence> sequences_;

  ContextSink* SinkFor(SequenceId sequence) const;
};

// Drafter side over a DEditDrafter; also the sink for the target's features.
// A sequence is created by its first context (start 0). Context is checked
// when it arrives and appended at the next Draft, every queued chunk in one
// DEditDrafter::AppendContexts call: a round of 16 sequences' verifies
// costs one context projection, not 16. A queued chunk is a view that keeps
// its whole forward's features alive, so the queue is appended early once
// it holds kMaxQueuedChunks chunks or kMaxQueuedRows rows (rounds without
// a Draft: the hybrid method's lookups, the confidence cut's back-off).
class LocalDrafter : public Drafter, public ContextSink {
 public:
  explicit LocalDrafter(DEditDrafter* drafter) : drafter_(drafter) {}

  absl::StatusOr<std::vector<DraftResult>> Draft(
      const std::vector<DraftRequest>& requests) override;
  absl::Status Release(SequenceId sequence) override;
  int block_size() const override { return drafter_->config().block_size; }
  int lookup_seed_ngram() const override {
    return drafter_->config().lookup_seed_ngram;
  }
  absl::Status OnContext(SequenceId sequence, int64_t start,
                         const at::Tensor& features) override;

  static constexpr size_t kMaxQueuedChunks = 256;
  static constexpr int64_t kMaxQueuedRows = 8192;

 private:
  DEditDrafter* drafter_;
  ContextQueue queued_;
};

}  // namespace dedit

#endif  // DEDIT_MODEL_LOCAL_BACKENDS_H_
