// How far two targets' greedy decodings agree: a widened target (widen.h)
// against the one it was widened from. Both decode each prompt in lockstep,
// one token per forward; at the first token they choose differently the
// prompt's agreement ends, and the logit gaps there say whether it was a
// near-tie (float summation order, bf16 rounding) or a real difference.
//
//   ASSIGN_OR_RETURN(AgreementReport r,
//                    MeasureGreedyAgreement(*tiny, *wide, prompts, 128));
//   std::cout << r.ToJson().dump(2);
#ifndef DEDIT_TRAINING_GREEDY_AGREEMENT_H_
#define DEDIT_TRAINING_GREEDY_AGREEMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/qwen3_model.h"
#include "nlohmann/json.hpp"

namespace dedit::training {

struct PromptAgreement {
  // The reference's greedy continuation (up to its EOS or the limit).
  int reference_tokens = 0;
  // Tokens of it the candidate chose too, before the first divergence.
  int agreed_tokens = 0;
  bool identical() const { return agreed_tokens == reference_tokens; }
  // At the first divergence (when not identical): the tokens each chose,
  // the reference's top-1 minus top-2 logit, and the candidate's logit of
  // its choice minus its logit of the reference's choice.
  int32_t reference_token = -1;
  int32_t candidate_token = -1;
  double reference_top2_gap = 0;
  double candidate_gap = 0;
};

struct AgreementReport {
  std::vector<PromptAgreement> prompts;
  int64_t agreed_tokens() const;
  int64_t reference_tokens() const;
  int identical_prompts() const;
  // agreed_tokens / reference_tokens (1 when there are none).
  double agreement() const;
  // The largest absolute logit difference over the prompts' own rows (the
  // prefills: the same inputs for both models), and the largest absolute
  // reference logit there, for scale.
  double max_prompt_logit_diff = 0;
  double max_abs_logit = 0;
  nlohmann::json ToJson() const;
};

// Decodes every prompt greedily with both models (max_new_tokens each, or
// until the reference's EOS or context limit), which must share a
// vocabulary. Each model
// gets a fresh sequence per prompt and gives it back. After a divergence
// the reference decodes on alone to count its tokens.
absl::StatusOr<AgreementReport> MeasureGreedyAgreement(
    Qwen3Model& reference, Qwen3Model& candidate,
    const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens);

}  // namespace dedit::training

#endif  // DEDIT_TRAINING_GREEDY_AGREEMENT_H_
