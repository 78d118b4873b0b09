#include "common/model/local_backends.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/model/verify_commit.h"

namespace dedit {

absl::StatusOr<TargetStepResult> LocalVerifier::Step(
    const std::vector<PrefillWork>& prefills,
    const std::vector<VerifyWork>& verifies) {
  std::vector<TargetSegment> segments;
  for (const PrefillWork& p : prefills) {
    RETURN_IF_ERROR(ValidateSamplingParams(p.sampling));
    if (p.prompt.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty prompt for sequence ", p.sequence));
    }
    if (model_->HasSequence(p.sequence)) {
      return absl::AlreadyExistsError(
          absl::StrCat("sequence ", p.sequence, " exists"));
    }
  }
  for (const PrefillWork& p : prefills) {
    RETURN_IF_ERROR(model_->AddSequence(p.sequence));
    sequences_[p.sequence] = {std::make_unique<TokenSampler>(p.sampling),
                              p.context};
    segments.push_back(
        {p.sequence, p.prompt, 0, {static_cast<int>(p.prompt.size()) - 1}});
  }
  for (const VerifyWork& v : verifies) {
    if (!sequences_.count(v.sequence)) {
      return absl::NotFoundError(absl::StrCat("unknown sequence ", v.sequence));
    }
    TargetSegment s{v.sequence, v.block, v.start, {}};
    for (size_t j = 0; j < v.block.size(); ++j) s.logit_rows.push_back(j);
    segments.push_back(std::move(s));
  }
  auto forward = model_->Forward(segments);
  if (!forward.ok()) {
    for (const PrefillWork& p : prefills) {
      (void)model_->RemoveSequence(p.sequence);
      sequences_.erase(p.sequence);
    }
    return forward.status();
  }
  const TargetForwardResult& out = *forward;
  TargetStepResult result;
  for (size_t i = 0; i < prefills.size(); ++i) {
    const PrefillWork& p = prefills[i];
    ASSIGN_OR_RETURN(
        std::optional<int32_t> first,
        CommitPrefillChunk(out, i, p.sequence, 0,
                           static_cast<int64_t>(p.prompt.size()),
                           /*last=*/true, *sequences_.at(p.sequence).sampler,
                           SinkFor(p.sequence)));
    result.first_tokens.push_back(*first);
  }
  for (size_t j = 0; j < verifies.size(); ++j) {
    const VerifyWork& v = verifies[j];
    ASSIGN_OR_RETURN(VerifyOutcome outcome,
                     CommitVerifyBlock(out, prefills.size() + j, v,
                                       *sequences_.at(v.sequence).sampler,
                                       *model_, SinkFor(v.sequence)));
    result.verified.push_back(std::move(outcome));
  }
  return result;
}

ContextSink* LocalVerifier::SinkFor(SequenceId sequence) const {
  return sequences_.at(sequence).context ? sink_ : nullptr;
}

absl::Status LocalVerifier::Release(SequenceId sequence) {
  sequences_.erase(sequence);
  return model_->RemoveSequence(sequence);
}

absl::StatusOr<std::vector<DraftResult>> LocalDrafter::Draft(
    const std::vector<DraftRequest>& requests) {
  RETURN_IF_ERROR(queued_.Flush(*drafter_));
  return drafter_->Draft(requests);
}

absl::Status LocalDrafter::Release(SequenceId sequence) {
  queued_.Drop(sequence);
  if (!drafter_->HasSequence(sequence)) return absl::OkStatus();
  return drafter_->RemoveSequence(sequence);
}

absl::Status LocalDrafter::OnContext(SequenceId sequence, int64_t start,
                                     const at::Tensor& features) {
  if (start == 0 && !drafter_->HasSequence(sequence)) {
    RETURN_IF_ERROR(drafter_->AddSequence(sequence));
  }
  std::optional<int64_t> cached = queued_.End(sequence);
  if (!cached.has_value()) {
    ASSIGN_OR_RETURN(cached, drafter_->ContextLength(sequence));
  }
  DEditDrafter::ContextChunk chunk{sequence, start, features};
  RETURN_IF_ERROR(drafter_->CheckContextChunk(chunk, *cached));
  queued_.Push(std::move(chunk));
  if (queued_.size() >= kMaxQueuedChunks || queued_.rows() >= kMaxQueuedRows) {
    return queued_.Flush(*drafter_);
  }
  return absl::OkStatus();
}

}  // namespace dedit
