#include "common/model/verify_commit.h"

#include <utility>
#include <vector>

#include "common/base/status.h"
#include "common/engine/acceptance.h"
#include "common/model/torch_status.h"

namespace dedit {
namespace {

absl::Status PublishRows(const TargetForwardResult& forward, size_t segment,
                         SequenceId sequence, int64_t start, int64_t rows,
                         ContextSink* sink) {
  if (sink == nullptr || !forward.features.defined()) return absl::OkStatus();
  ASSIGN_OR_RETURN(at::Tensor features, GuardTorch([&] {
                     return forward.features.narrow(
                         0, forward.token_offsets[segment], rows);
                   }));
  return sink->OnContext(sequence, start, features);
}

// Row r of the segment chooses the token at `first_position + r` (the
// position after the row's input token): what a seeded draw is keyed on.
absl::StatusOr<std::vector<int32_t>> Choose(const TargetForwardResult& forward,
                                            size_t segment, int64_t rows,
                                            int64_t first_position,
                                            TokenSampler& sampler) {
  if (sampler.greedy() && !forward.greedy.empty()) {
    // The batch's argmax, computed once per forward.
    const auto first = forward.greedy.begin() + forward.logit_offsets[segment];
    return std::vector<int32_t>(first, first + rows);
  }
  return GuardTorch([&] {
    return sampler.Choose(
        forward.logits.narrow(0, forward.logit_offsets[segment], rows),
        first_position);
  });
}

}  // namespace

absl::StatusOr<VerifyOutcome> CommitVerifyBlock(
    const TargetForwardResult& forward, size_t segment, const VerifyWork& work,
    TokenSampler& sampler, Qwen3Model& model, ContextSink* sink) {
  const int64_t rows = static_cast<int64_t>(work.block.size());
  ASSIGN_OR_RETURN(std::vector<int32_t> choices,
                   Choose(forward, segment, rows, work.start + 1, sampler));
  VerifyOutcome outcome;
  const std::vector<int32_t> draft(work.block.begin() + 1, work.block.end());
  outcome.accepted = AcceptedPrefixLength(draft, choices);
  outcome.target_tokens = std::move(choices);
  const int64_t committed = outcome.accepted + 1;
  RETURN_IF_ERROR(model.Truncate(work.sequence, work.start + committed));
  RETURN_IF_ERROR(PublishRows(forward, segment, work.sequence, work.start,
                              committed, sink));
  return outcome;
}

absl::StatusOr<std::optional<int32_t>> CommitPrefillChunk(
    const TargetForwardResult& forward, size_t segment, SequenceId sequence,
    int64_t start, int64_t length, bool last, TokenSampler& sampler,
    ContextSink* sink) {
  RETURN_IF_ERROR(PublishRows(forward, segment, sequence, start, length, sink));
  if (!last) return std::optional<int32_t>();
  ASSIGN_OR_RETURN(std::vector<int32_t> choice,
                   Choose(forward, segment, 1, start + length, sampler));
  return std::optional<int32_t>(choice[0]);
}

}  // namespace dedit
