#include "common/local_backends.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/torch_status.h"

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
    samplers_[p.sequence] = std::make_unique<TokenSampler>(p.sampling);
    segments.push_back({p.sequence, p.prompt, 0,
                        {static_cast<int>(p.prompt.size()) - 1}});
  }
  for (const VerifyWork& v : verifies) {
    if (!samplers_.count(v.sequence)) {
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
      samplers_.erase(p.sequence);
    }
    return forward.status();
  }
  const TargetForwardResult& out = *forward;
  TargetStepResult result;
  for (size_t i = 0; i < segments.size(); ++i) {
    const TargetSegment& s = segments[i];
    const int64_t rows = static_cast<int64_t>(s.logit_rows.size());
    ASSIGN_OR_RETURN(
        std::vector<int32_t> choices,
        GuardTorch([&] {
          return samplers_.at(s.sequence)
              ->Choose(out.logits.narrow(0, out.logit_offsets[i], rows));
        }));
    int64_t committed_rows = static_cast<int64_t>(s.tokens.size());
    if (i < prefills.size()) {
      result.first_tokens.push_back(choices[0]);
    } else {
      VerifyOutcome outcome;
      const std::vector<int32_t> draft(s.tokens.begin() + 1, s.tokens.end());
      outcome.accepted = AcceptedPrefixLength(draft, choices);
      outcome.target_tokens = std::move(choices);
      committed_rows = outcome.accepted + 1;
      RETURN_IF_ERROR(model_->Truncate(s.sequence, s.start + committed_rows));
      result.verified.push_back(std::move(outcome));
    }
    if (sink_ != nullptr && out.features.defined()) {
      RETURN_IF_ERROR(sink_->OnContext(
          s.sequence, s.start,
          out.features.narrow(0, out.token_offsets[i], committed_rows)));
    }
  }
  return result;
}

absl::Status LocalVerifier::Release(SequenceId sequence) {
  samplers_.erase(sequence);
  return model_->RemoveSequence(sequence);
}

absl::StatusOr<std::vector<DraftResult>> LocalDrafter::Draft(
    const std::vector<DraftRequest>& requests) {
  return drafter_->Draft(requests);
}

absl::Status LocalDrafter::Release(SequenceId sequence) {
  if (!drafter_->HasSequence(sequence)) return absl::OkStatus();
  return drafter_->RemoveSequence(sequence);
}

absl::Status LocalDrafter::OnContext(SequenceId sequence, int64_t start,
                                     const at::Tensor& features) {
  if (start == 0 && !drafter_->HasSequence(sequence)) {
    RETURN_IF_ERROR(drafter_->AddSequence(sequence));
  }
  return drafter_->AppendContext(sequence, start, features);
}

}  // namespace dedit
