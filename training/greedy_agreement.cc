#include "training/greedy_agreement.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/model/torch_status.h"

namespace dedit::training {
namespace {

// Sequence ids of the measurement (fresh per prompt, given back).
constexpr SequenceId kReferenceSequence = 0x5eed0001;
constexpr SequenceId kCandidateSequence = 0x5eed0002;

// The logit row `row` of `r` as floats on the CPU.
std::vector<float> LogitRow(const TargetForwardResult& r, int64_t row) {
  at::Tensor t = r.logits[row].to(at::kCPU, at::kFloat).contiguous();
  return std::vector<float>(t.data_ptr<float>(),
                            t.data_ptr<float>() + t.numel());
}

// The top-1 minus top-2 logit of `row`.
double Top2Gap(const std::vector<float>& row) {
  float best = -INFINITY, second = -INFINITY;
  for (float v : row) {
    if (v > best) {
      second = best;
      best = v;
    } else if (v > second) {
      second = v;
    }
  }
  return static_cast<double>(best) - second;
}

// One token of `sequence` at `position`, its next-token logits.
absl::StatusOr<TargetForwardResult> Step(Qwen3Model& model, SequenceId sequence,
                                         int32_t token, int64_t position) {
  return model.Forward({{sequence, {token}, position, {0}}});
}

absl::StatusOr<PromptAgreement> MeasurePrompt(Qwen3Model& reference,
                                              Qwen3Model& candidate,
                                              const std::vector<int32_t>& p,
                                              int max_new_tokens,
                                              AgreementReport* report) {
  const std::vector<int>& eos = reference.config().eos_token_ids;
  const int n = static_cast<int>(p.size());
  std::vector<int> all_rows(n);
  for (int i = 0; i < n; ++i) all_rows[i] = i;
  ASSIGN_OR_RETURN(TargetForwardResult r,
                   reference.Forward({{kReferenceSequence, p, 0, all_rows}}));
  ASSIGN_OR_RETURN(TargetForwardResult c,
                   candidate.Forward({{kCandidateSequence, p, 0, all_rows}}));
  RETURN_IF_ERROR(GuardTorch([&] {
    report->max_prompt_logit_diff =
        std::max(report->max_prompt_logit_diff,
                 (r.logits - c.logits).abs().max().item<double>());
    report->max_abs_logit =
        std::max(report->max_abs_logit, r.logits.abs().max().item<double>());
  }));
  PromptAgreement out;
  int64_t position = n;
  int32_t ref_token = r.greedy.back(), cand_token = c.greedy.back();
  // The logit row of r and c that chose the current tokens: the prompt's
  // last, then the one row of each step. Read only where they part.
  int64_t row = n - 1;
  bool together = true;
  for (int i = 0; i < max_new_tokens; ++i) {
    ++out.reference_tokens;
    if (together && ref_token == cand_token) {
      ++out.agreed_tokens;
    } else if (together) {
      together = false;
      out.reference_token = ref_token;
      out.candidate_token = cand_token;
      out.reference_top2_gap = Top2Gap(LogitRow(r, row));
      const std::vector<float> cand_row = LogitRow(c, row);
      out.candidate_gap =
          static_cast<double>(cand_row[cand_token]) - cand_row[ref_token];
    }
    if (std::find(eos.begin(), eos.end(), ref_token) != eos.end()) break;
    if (i + 1 == max_new_tokens ||
        position >= reference.config().max_position_embeddings) {
      break;
    }
    ASSIGN_OR_RETURN(r,
                     Step(reference, kReferenceSequence, ref_token, position));
    ref_token = r.greedy[0];
    if (together) {
      ASSIGN_OR_RETURN(
          c, Step(candidate, kCandidateSequence, cand_token, position));
      cand_token = c.greedy[0];
    }
    row = 0;
    ++position;
  }
  return out;
}

}  // namespace

int64_t AgreementReport::agreed_tokens() const {
  int64_t n = 0;
  for (const PromptAgreement& p : prompts) n += p.agreed_tokens;
  return n;
}

int64_t AgreementReport::reference_tokens() const {
  int64_t n = 0;
  for (const PromptAgreement& p : prompts) n += p.reference_tokens;
  return n;
}

int AgreementReport::identical_prompts() const {
  return static_cast<int>(
      std::count_if(prompts.begin(), prompts.end(),
                    [](const PromptAgreement& p) { return p.identical(); }));
}

double AgreementReport::agreement() const {
  const int64_t total = reference_tokens();
  return total == 0 ? 1.0 : static_cast<double>(agreed_tokens()) / total;
}

nlohmann::json AgreementReport::ToJson() const {
  nlohmann::json j;
  j["prompts"] = prompts.size();
  j["identical_prompts"] = identical_prompts();
  j["agreed_tokens"] = agreed_tokens();
  j["reference_tokens"] = reference_tokens();
  j["agreement"] = agreement();
  j["max_prompt_logit_diff"] = max_prompt_logit_diff;
  j["max_abs_logit"] = max_abs_logit;
  nlohmann::json divergences = nlohmann::json::array();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const PromptAgreement& p = prompts[i];
    if (p.identical()) continue;
    divergences.push_back({{"prompt", i},
                           {"at_token", p.agreed_tokens},
                           {"of_tokens", p.reference_tokens},
                           {"reference_token", p.reference_token},
                           {"candidate_token", p.candidate_token},
                           {"reference_top2_gap", p.reference_top2_gap},
                           {"candidate_gap", p.candidate_gap}});
  }
  j["divergences"] = divergences;
  return j;
}

absl::StatusOr<AgreementReport> MeasureGreedyAgreement(
    Qwen3Model& reference, Qwen3Model& candidate,
    const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens) {
  if (reference.config().vocab_size != candidate.config().vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocabularies differ: ", reference.config().vocab_size,
                     " vs ", candidate.config().vocab_size));
  }
  if (max_new_tokens < 1) {
    return absl::InvalidArgumentError("max_new_tokens must be >= 1");
  }
  AgreementReport report;
  for (const std::vector<int32_t>& p : prompts) {
    if (p.empty()) return absl::InvalidArgumentError("empty prompt");
    RETURN_IF_ERROR(reference.AddSequence(kReferenceSequence));
    absl::Status added = candidate.AddSequence(kCandidateSequence);
    if (!added.ok()) {
      reference.RemoveSequence(kReferenceSequence).IgnoreError();
      return added;
    }
    absl::StatusOr<PromptAgreement> a =
        MeasurePrompt(reference, candidate, p, max_new_tokens, &report);
    const absl::Status removed_ref =
        reference.RemoveSequence(kReferenceSequence);
    const absl::Status removed_cand =
        candidate.RemoveSequence(kCandidateSequence);
    if (!a.ok()) return a.status();
    RETURN_IF_ERROR(removed_ref);
    RETURN_IF_ERROR(removed_cand);
    report.prompts.push_back(*a);
  }
  return report;
}

}  // namespace dedit::training
