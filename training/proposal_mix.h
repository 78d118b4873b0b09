// The DEdit drafter's training objective pieces: per-slot loss weights and
// ProposalMix, the construction of the edit pass's input.
//
// ProposalMix (our reading of the DEdit paper): run P1 on [anchor, MASK...],
// take its argmax y1 and confidence c1 per slot; slots with c1 >= eta take
// the ground-truth token, the others keep y1. P2 runs on [anchor, mix] with
// the same weights and learns to predict the ground truth at every slot, so
// the editor sees its own (possibly wrong) low-confidence guesses next to
// mostly-correct confident ones — the situation it meets at inference.
// Without ProposalMix (ablation) the P2 input is plain y1.
//
//   at::Tensor w = SlotLossWeights(16, 7.0);             // [15]
//   EditInput in = BuildEditInput(gt, y1, c1, valid, 0.5, true);
//   at::Tensor p2_logits = drafter.BlockLogits(ctx, in.tokens, ...);
#ifndef DEDIT_TRAINING_PROPOSAL_MIX_H_
#define DEDIT_TRAINING_PROPOSAL_MIX_H_

#include <ATen/Tensor.h>

namespace dedit::training {

// w_k = exp(-(k - 1) / gamma) for slots k = 1 .. window-1 (DFlash's decay:
// early slots matter most because acceptance is a prefix). fp32 [window-1].
at::Tensor SlotLossWeights(int window, double gamma);

// Weighted cross-entropy over block slots 1..W-1.
//   logits: [..., W-1, V] fp32; targets: [..., W-1] int64;
//   valid:  [..., W-1] bool (slots past the end of a sequence are false);
//   slot_weights: [W-1] (SlotLossWeights), or per slot [..., W-1]
//   (EditLossWeights).
// Returns sum(w_k * CE) / sum(w_k) over valid slots (0 when none is valid).
at::Tensor WeightedSlotLoss(const at::Tensor& logits, const at::Tensor& targets,
                            const at::Tensor& valid,
                            const at::Tensor& slot_weights);

// The paper's three ProposalMix rates over valid slots (fractions in [0, 1]).
struct ProposalMixRates {
  double p1_accuracy = 0;   // y1 == ground truth
  double gt_selection = 0;  // c1 >= eta: the slot takes the ground truth
  double overwrite = 0;     // c1 >= eta and y1 != ground truth
};

struct EditInput {
  at::Tensor tokens;  // [..., W] int64: slot 0 = anchor, then the mix
  // [..., W-1] bool: the slots whose input is the ground truth (valid and
  // selected; all false without ProposalMix).
  at::Tensor selected;
  ProposalMixRates rates;
};

// block:       [..., W] int64, slot 0 = anchor, slots 1.. = ground truth;
// proposal:    [..., W-1] int64, P1 argmax at slots 1..W-1;
// confidence:  [..., W-1] fp32, P1 max softmax probability;
// valid:       [..., W-1] bool; invalid slots keep the proposal.
// With proposal_mix false the input is [anchor, proposal] (rates are still
// measured, with eta, for logging).
EditInput BuildEditInput(const at::Tensor& block, const at::Tensor& proposal,
                         const at::Tensor& confidence, const at::Tensor& valid,
                         double eta, bool proposal_mix);

// Per-slot weights of the edit pass's loss: slot_weights ([W-1]) at every
// valid slot, times `selected_weight` at the selected ones, whose input
// already is the label (copying it is all the loss asks there). 0 trains
// the editor only where its input is P1's own guess. [..., W-1] fp32, 0 at
// invalid slots; pass it to WeightedSlotLoss as its slot weights.
at::Tensor EditLossWeights(const at::Tensor& slot_weights,
                           const at::Tensor& selected, const at::Tensor& valid,
                           double selected_weight);

// Adaptive ProposalMix threshold: the eta at which the ground truth is
// selected for about `ratio` x (P1 accuracy) of the valid slots, i.e. the
// confidence of the m-th most confident valid slot, m = round(ratio *
// correct). The paper's Table 6 has selection / P1 accuracy at 0.85-0.9;
// with a fixed eta a weak P1 selects far less than its accuracy
// (docs/log/2026-12-06-results-notebook.md, "The ProposalMix ablation"), and
// the editor learns to ignore its block. Returns a value above 1 (nothing
// selected) when m is 0.
double AdaptiveEta(const at::Tensor& proposal, const at::Tensor& confidence,
                   const at::Tensor& truth, const at::Tensor& valid,
                   double ratio);

}  // namespace dedit::training

#endif  // DEDIT_TRAINING_PROPOSAL_MIX_H_
