#include "training/proposal_mix.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>
#include <tuple>

namespace dedit::training {

at::Tensor SlotLossWeights(int window, double gamma) {
  at::Tensor k = at::arange(1, window, at::TensorOptions().dtype(at::kDouble));
  return at::exp(-(k - 1.0) / gamma).to(at::kFloat);
}

at::Tensor WeightedSlotLoss(const at::Tensor& logits, const at::Tensor& targets,
                            const at::Tensor& valid,
                            const at::Tensor& slot_weights) {
  at::Tensor nll = -at::log_softmax(logits, -1)
                        .gather(-1, targets.unsqueeze(-1))
                        .squeeze(-1);
  at::Tensor w = slot_weights.expand_as(nll) * valid.to(at::kFloat);
  return (nll * w).sum() / w.sum().clamp_min(1e-12);
}

EditInput BuildEditInput(const at::Tensor& block, const at::Tensor& proposal,
                         const at::Tensor& confidence, const at::Tensor& valid,
                         double eta, bool proposal_mix) {
  const int64_t w = block.size(-1);
  at::Tensor anchor = block.narrow(-1, 0, 1);
  at::Tensor truth = block.narrow(-1, 1, w - 1);
  at::Tensor confident = (confidence >= eta).logical_and(valid);
  at::Tensor mixed =
      proposal_mix ? at::where(confident, truth, proposal) : proposal;
  EditInput out;
  out.tokens = at::cat({anchor, mixed}, -1);
  out.selected = proposal_mix ? confident : at::zeros_like(confident);
  const double n = std::max<double>(valid.sum().item<int64_t>(), 1.0);
  at::Tensor correct = proposal.eq(truth).logical_and(valid);
  out.rates.p1_accuracy = correct.sum().item<int64_t>() / n;
  out.rates.gt_selection = confident.sum().item<int64_t>() / n;
  out.rates.overwrite =
      confident.logical_and(correct.logical_not()).sum().item<int64_t>() / n;
  return out;
}

at::Tensor EditLossWeights(const at::Tensor& slot_weights,
                           const at::Tensor& selected, const at::Tensor& valid,
                           double selected_weight) {
  // 1 at kept slots, selected_weight at selected ones.
  at::Tensor scale = selected.to(at::kFloat) * (selected_weight - 1.0) + 1.0;
  return slot_weights.expand_as(scale) * scale * valid.to(at::kFloat);
}

double AdaptiveEta(const at::Tensor& proposal, const at::Tensor& confidence,
                   const at::Tensor& truth, const at::Tensor& valid,
                   double ratio) {
  const int64_t correct =
      proposal.eq(truth).logical_and(valid).sum().item<int64_t>();
  const int64_t m = std::llround(ratio * static_cast<double>(correct));
  if (m <= 0) return 2.0;
  at::Tensor c = confidence.masked_select(valid);
  const int64_t take = std::min<int64_t>(m, c.numel());
  // The take-th largest confidence: slots at or above it are selected.
  return std::get<0>(c.to(at::kFloat).topk(take)).min().item<double>();
}

}  // namespace dedit::training
