#include "training/drafter_trainer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/model_config.h"
#include "common/base/status.h"
#include "common/engine/ngram_drafter.h"
#include "common/model/tensor_io.h"
#include "common/model/torch_status.h"
#include "common/tokenizer/tokenizer.h"
#include "training/proposal_mix.h"
#include "training/trainable_models.h"

namespace dedit::training {
namespace {

// Rounds each on-policy anchor's walk takes (round_anchor_share): two
// rounds from a uniform start end anchored as the engine's rounds are
// (after a block that missed or was used up) without walking whole answers
// (RoundAnchors says what they do not match).
constexpr int kRoundAnchorWalk = 2;

// Greedy proposal and confidence (max softmax probability) per slot.
void ArgmaxAndConfidence(const at::Tensor& logits, at::Tensor* tokens,
                         at::Tensor* confidence) {
  auto [max_logit, argmax] = logits.max(-1);
  *tokens = argmax;
  *confidence = at::exp(logits - max_logit.unsqueeze(-1)).sum(-1).reciprocal();
}

// Leading slots equal to the truth per block ([S, NB]; a block accepts no
// further than the end of its sequence).
at::Tensor AcceptedPerBlock(const at::Tensor& proposal,
                            const BlockBatch& batch) {
  const int64_t w = batch.truth.size(-1);
  at::Tensor truth = batch.truth.narrow(-1, 1, w - 1);
  at::Tensor correct = proposal.eq(truth).logical_and(batch.valid);
  return correct.to(at::kLong).cumprod(-1).sum(-1);
}

// ... summed over blocks: tau = 1 + sum / blocks.
double AcceptedSum(const at::Tensor& proposal, const BlockBatch& batch) {
  return AcceptedPerBlock(proposal, batch).sum().item<double>();
}

std::string Fingerprint(const DrafterTrainingOptions& o,
                        const DrafterConfig& d) {
  return absl::StrCat(
      DrafterConfigToJson(d), " gamma=", o.gamma, " eta=", o.eta,
      " mix=", o.proposal_mix, " causal=", o.causal_editor,
      " edit_w=", o.edit_loss_weight, " S=", o.sequences_per_step,
      " NB=", o.blocks_per_sequence, " steps=", o.steps, " seed=", o.seed,
      " lr=", o.schedule.peak, " windows=", absl::StrJoin(o.train_windows, ","),
      " gt_ratio=", o.gt_selection_ratio, " p1_only=", o.p1_only_steps,
      " plateau=", o.plateau_delta, " patience=", o.plateau_patience,
      o.init_from.empty() ? "" : " init_from=", o.init_from,
      // Only when set, so that runs from before the option still resume.
      o.round_anchor_share > 0
          ? absl::StrCat(" round_anchors=", o.round_anchor_share)
          : "",
      o.edit_selected_weight != 1.0
          ? absl::StrCat(" edit_selected_w=", o.edit_selected_weight)
          : "",
      o.edit_truth_share > 0
          ? absl::StrCat(" edit_truth_share=", o.edit_truth_share)
          : "",
      o.edit_truth_blocks != 1.0
          ? absl::StrCat(" edit_truth_blocks=", o.edit_truth_blocks)
          : "");
}

}  // namespace

BlockBatch MakeBlockBatch(
    const std::vector<const DistillRecord*>& sequences, int blocks_per_sequence,
    int window, int32_t mask_id, int32_t pad_id, std::mt19937_64* rng,
    const std::vector<std::vector<int64_t>>& fixed_anchors) {
  const int64_t s = static_cast<int64_t>(sequences.size());
  const int64_t nb = blocks_per_sequence, w = window;
  int64_t t = 0;
  for (const DistillRecord* r : sequences) {
    t = std::max<int64_t>(t, static_cast<int64_t>(r->tokens.size()));
  }
  std::vector<int64_t> ids(s * t, pad_id), anchors(s * nb), truth(s * nb * w),
      p1(s * nb * w);
  std::vector<uint8_t> valid(s * nb * (w - 1));
  for (int64_t i = 0; i < s; ++i) {
    const DistillRecord& r = *sequences[i];
    const int64_t len = static_cast<int64_t>(r.tokens.size());
    std::copy(r.tokens.begin(), r.tokens.end(), ids.begin() + i * t);
    const int64_t lo = std::min<int64_t>(r.prompt_len, len - 2);
    std::uniform_int_distribution<int64_t> pick(std::max<int64_t>(lo, 0),
                                                std::max<int64_t>(len - 2, 0));
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t a =
          fixed_anchors.empty() ? pick(*rng) : fixed_anchors[i][b];
      anchors[i * nb + b] = a;
      for (int64_t j = 0; j < w; ++j) {
        const int64_t pos = a + j;
        const int64_t tok = pos < len ? r.tokens[pos] : pad_id;
        truth[(i * nb + b) * w + j] = tok;
        p1[(i * nb + b) * w + j] = j == 0 ? tok : mask_id;
        if (j > 0) valid[(i * nb + b) * (w - 1) + j - 1] = pos < len;
      }
    }
  }
  auto long_opts = at::TensorOptions().dtype(at::kLong);
  BlockBatch batch;
  batch.ids = at::tensor(ids, long_opts).view({s, t});
  batch.anchors = at::tensor(anchors, long_opts).view({s, nb});
  batch.truth = at::tensor(truth, long_opts).view({s, nb, w});
  batch.p1_tokens = at::tensor(p1, long_opts).view({s, nb, w});
  batch.valid =
      at::tensor(std::vector<int64_t>(valid.begin(), valid.end()), long_opts)
          .view({s, nb, w - 1})
          .to(at::kBool);
  return batch;
}

void SeedWithLookup(const std::vector<const DistillRecord*>& sequences,
                    int min_ngram, int32_t mask_id, BlockBatch* batch) {
  const int64_t s = batch->p1_tokens.size(0), nb = batch->p1_tokens.size(1),
                w = batch->p1_tokens.size(2);
  const NgramDrafter lookup(LookupSeedOptions(min_ngram, static_cast<int>(w)));
  at::Tensor anchors = batch->anchors.contiguous();
  const int64_t* anchor = anchors.data_ptr<int64_t>();
  std::vector<int64_t> p1(s * nb * w, mask_id);
  std::vector<int32_t> known;
  for (int64_t i = 0; i < s; ++i) {
    const std::vector<int32_t>& tokens = sequences[i]->tokens;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t a = anchor[i * nb + b];
      known.assign(tokens.begin(), tokens.begin() + a + 1);
      int64_t* block = p1.data() + (i * nb + b) * w;
      block[0] = tokens[a];
      const std::vector<int32_t> proposal =
          lookup.Propose(known, static_cast<int>(w - 1));
      std::copy(proposal.begin(), proposal.end(), block + 1);
    }
  }
  batch->p1_tokens =
      at::tensor(p1, at::TensorOptions().dtype(at::kLong)).view({s, nb, w});
}

namespace {

// One round of blocks anchored at `anchors` (one list per sequence, all of
// the same length): how many of `propose`'s draft tokens each accepts,
// sequence by sequence (WalkRounds, RoundAnchors).
std::vector<int64_t> AcceptedAt(
    const std::vector<const DistillRecord*>& sequences,
    const std::vector<std::vector<int64_t>>& anchors, int window,
    int32_t mask_id, int32_t pad_id,
    const std::function<at::Tensor(const BlockBatch&)>& propose) {
  const size_t blocks = anchors[0].size();
  BlockBatch batch = MakeBlockBatch(sequences, static_cast<int>(blocks), window,
                                    mask_id, pad_id, nullptr, anchors);
  const at::Tensor accepted =
      AcceptedPerBlock(propose(batch), batch)
          .view({static_cast<int64_t>(sequences.size() * blocks)})
          .contiguous();
  const int64_t* acc = accepted.data_ptr<int64_t>();
  return std::vector<int64_t>(acc, acc + accepted.numel());
}

}  // namespace

Rounds WalkRounds(const std::vector<const DistillRecord*>& sequences,
                  int window, int32_t mask_id, int32_t pad_id,
                  const std::function<at::Tensor(const BlockBatch&)>& propose) {
  const size_t s = sequences.size();
  std::vector<std::vector<int64_t>> anchors(s, std::vector<int64_t>(1));
  std::vector<int64_t> last(s);
  for (size_t i = 0; i < s; ++i) {
    anchors[i][0] = sequences[i]->prompt_len;
    last[i] = static_cast<int64_t>(sequences[i]->tokens.size()) - 1;
  }
  Rounds out;
  while (true) {
    bool any = false;
    for (size_t i = 0; i < s; ++i) any = any || anchors[i][0] < last[i];
    if (!any) break;
    const std::vector<int64_t> acc =
        AcceptedAt(sequences, anchors, window, mask_id, pad_id, propose);
    for (size_t i = 0; i < s; ++i) {
      int64_t& a = anchors[i][0];
      if (a >= last[i]) continue;
      const int64_t committed = std::min(acc[i] + 1, last[i] - a);
      out.tokens += static_cast<double>(committed);
      out.rounds += 1;
      a += committed;
    }
  }
  return out;
}

std::vector<std::vector<int64_t>> RoundAnchors(
    const std::vector<const DistillRecord*>& sequences,
    std::vector<std::vector<int64_t>> starts, int rounds, int window,
    int32_t mask_id, int32_t pad_id,
    const std::function<at::Tensor(const BlockBatch&)>& propose) {
  const size_t s = sequences.size();
  if (s == 0 || starts.empty() || starts[0].empty()) return starts;
  const int64_t m = static_cast<int64_t>(starts[0].size());
  std::vector<std::vector<int64_t>> anchors = starts;
  for (int r = 0; r < rounds; ++r) {
    const std::vector<int64_t> acc =
        AcceptedAt(sequences, anchors, window, mask_id, pad_id, propose);
    for (size_t i = 0; i < s; ++i) {
      const int64_t end = static_cast<int64_t>(sequences[i]->tokens.size()) - 2;
      for (int64_t j = 0; j < m; ++j) {
        int64_t& a = anchors[i][j];
        a += acc[i * m + j] + 1;  // the accepted tokens and the bonus
        if (a > end) a = starts[i][j];
      }
    }
  }
  return anchors;
}

namespace {

// The options' ranges, and the combinations a run cannot use.
absl::Status CheckDrafterOptions(const DrafterTrainingOptions& o) {
  if (o.plateau_patience < 1) {
    return absl::InvalidArgumentError("--plateau_patience must be >= 1");
  }
  if (!(o.round_anchor_share >= 0 && o.round_anchor_share <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--round_anchor_share must be in [0, 1], got ", o.round_anchor_share));
  }
  if (!(o.edit_selected_weight >= 0 && std::isfinite(o.edit_selected_weight))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--edit_selected_weight must be a finite number >= 0, got ",
        o.edit_selected_weight));
  }
  if (!(o.edit_truth_share >= 0 && o.edit_truth_share <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--edit_truth_share must be in [0, 1], got ", o.edit_truth_share));
  }
  if (!(o.edit_truth_blocks > 0 && o.edit_truth_blocks <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--edit_truth_blocks must be in (0, 1], got ", o.edit_truth_blocks));
  }
  if (o.edit_truth_blocks != 1.0 && o.edit_truth_share == 0) {
    return absl::InvalidArgumentError(
        "--edit_truth_blocks picks the blocks that take --edit_truth_share: "
        "it needs --edit_truth_share > 0");
  }
  if (o.edit_truth_share > 0 && !o.proposal_mix) {
    return absl::InvalidArgumentError(
        "--edit_truth_share builds the ProposalMix input: it needs "
        "--proposal_mix=true");
  }
  if (o.lookup_seed_ngram < 0 || o.lookup_seed_ngram > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lookup_seed_ngram must be in [0, 64], got ", o.lookup_seed_ngram));
  }
  if (!(o.seed_logit_bonus >= 0 && o.seed_logit_bonus <= kMaxSeedLogitBonus)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seed_logit_bonus must be in [0, ", kMaxSeedLogitBonus,
                     "], got ", o.seed_logit_bonus));
  }
  if (o.seed_logit_bonus > 0 && o.lookup_seed_ngram <= 0) {
    return absl::InvalidArgumentError(
        "--seed_logit_bonus trusts the lookup's seed: it needs "
        "--lookup_seed_ngram > 0");
  }
  return absl::OkStatus();
}

// The target, frozen (it gives the context features, the embedding and
// the lm_head), and the token ids of its tokenizer that blocks use.
struct FrozenTarget {
  TrainableTarget model;
  int32_t mask_id = 0;  // <|mask|>: P1's input at the slots it predicts
  int32_t eot_id = 0;   // <|endoftext|>: pads blocks past a sequence's end
};

absl::StatusOr<FrozenTarget> LoadFrozenTarget(const std::string& dir) {
  FrozenTarget target;
  ASSIGN_OR_RETURN(target.model, TrainableTarget::Load(dir));
  target.model.Freeze();
  ASSIGN_OR_RETURN(auto tokenizer,
                   Tokenizer::FromFile(dir + "/tokenizer.json"));
  const std::optional<int32_t> mask = tokenizer->TokenToId("<|mask|>");
  const std::optional<int32_t> eot = tokenizer->TokenToId("<|endoftext|>");
  if (!mask || !eot) {
    return absl::InvalidArgumentError(
        "tokenizer needs <|mask|> and <|endoftext|> tokens");
  }
  target.mask_id = *mask;
  target.eot_id = *eot;
  return std::move(target);
}

// The drafter asked for: the target's layer shape with the options'
// overrides, trained in float32, its feature layers checked against `tc`.
absl::StatusOr<DrafterConfig> BuildDrafterConfig(
    const DrafterTrainingOptions& o, const Qwen3Config& tc, int32_t mask_id) {
  DrafterConfig dc;
  dc.layers = tc;
  dc.layers.num_hidden_layers = o.num_layers;
  if (o.intermediate_size > 0)
    dc.layers.intermediate_size = o.intermediate_size;
  dc.layers.dtype = "float32";
  dc.block_size = o.block_size;
  dc.mask_token_id = mask_id;
  dc.target_layer_ids = o.target_layer_ids.empty()
                            ? DefaultTargetLayerIds(tc.num_hidden_layers, 3)
                            : o.target_layer_ids;
  dc.num_target_layers = tc.num_hidden_layers;
  dc.num_passes = o.num_passes;
  dc.causal_editor = o.causal_editor;
  dc.lookup_seed_ngram = o.lookup_seed_ngram;
  // 0 unless training with it: the trust in the seed is then fitted on the
  // exported drafter (scripts/fit_seed_bonus.py).
  dc.seed_logit_bonus = o.seed_logit_bonus;
  dc.has_dedit_config = true;
  RETURN_IF_ERROR(CheckDrafterMatchesTarget(dc, tc));
  return dc;
}

// The block lengths cycled over the steps, each in [2, block_size].
absl::StatusOr<std::vector<int>> TrainWindows(const DrafterTrainingOptions& o) {
  const std::vector<int> windows = o.train_windows.empty()
                                       ? std::vector<int>{o.block_size}
                                       : o.train_windows;
  for (int w : windows) {
    if (w < 2 || w > o.block_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("train window ", w, " outside [2, ", o.block_size, "]"));
    }
  }
  return windows;
}

// The distilled sequences: steps draw from records[0, n_train); `heldout`
// points into heldout_records (--heldout_path's) or else at the records
// past n_train. Filled in place (LoadDistillData) so the pointers stay put.
struct DistillData {
  std::vector<DistillRecord> records;
  int64_t n_train = 0;
  std::vector<DistillRecord> heldout_records;
  std::vector<const DistillRecord*> heldout;
};

// Keeps the records with room for a block: an anchor in the generated part
// and at least one token after it.
void KeepUsable(std::vector<DistillRecord>* records) {
  records->erase(std::remove_if(records->begin(), records->end(),
                                [](const DistillRecord& r) {
                                  return static_cast<int64_t>(r.tokens.size()) <
                                         r.prompt_len + 2;
                                }),
                 records->end());
}

absl::Status LoadDistillData(const DrafterTrainingOptions& o,
                             DistillData* data) {
  ASSIGN_OR_RETURN(data->records, ReadDistillFiles(o.distill_path));
  KeepUsable(&data->records);
  data->n_train = static_cast<int64_t>(data->records.size());
  if (!o.heldout_path.empty()) {
    ASSIGN_OR_RETURN(data->heldout_records, ReadDistillData(o.heldout_path));
    KeepUsable(&data->heldout_records);
    for (const DistillRecord& r : data->heldout_records) {
      data->heldout.push_back(&r);
    }
  } else {
    const int64_t n = std::min<int64_t>(
        o.heldout_sequences, static_cast<int64_t>(data->records.size()) / 10);
    data->n_train -= n;
    for (int64_t i = data->n_train; i < data->n_train + n; ++i)
      data->heldout.push_back(&data->records[i]);
  }
  if (data->n_train < o.sequences_per_step) {
    return absl::FailedPreconditionError(
        absl::StrCat("only ", data->records.size(),
                     " usable distilled sequences in ", o.distill_path));
  }
  return absl::OkStatus();
}

// What the run trains on and how, on stderr.
void DescribeRun(const DrafterTrainingOptions& o, const DrafterConfig& dc,
                 const std::vector<int>& windows, const DistillData& data) {
  std::cerr << absl::StrFormat(
      "[drafter] %d train / %d held-out sequences (%s); feature layers [%s]; "
      "windows [%s]; ProposalMix %s (%s), %s editor; P1-only warm-up up to "
      "%d steps\n",
      data.n_train, data.heldout.size(),
      o.heldout_path.empty() ? "last records" : o.heldout_path,
      absl::StrJoin(dc.target_layer_ids, ","), absl::StrJoin(windows, ","),
      o.proposal_mix ? "on" : "off",
      o.edit_truth_share > 0 && o.edit_truth_blocks < 1
          ? absl::StrFormat(
                "ground truth at a random %.0f%% of the slots in %.0f%% of "
                "the blocks, eta %.2f in the others",
                100 * o.edit_truth_share, 100 * o.edit_truth_blocks, o.eta)
      : o.edit_truth_share > 0
          ? absl::StrFormat("ground truth at a random %.0f%% of the slots",
                            100 * o.edit_truth_share)
      : o.gt_selection_ratio > 0
          ? absl::StrFormat("adaptive eta, selection %.2f x P1 accuracy",
                            o.gt_selection_ratio)
          : absl::StrFormat("eta %.2f", o.eta),
      o.causal_editor ? "causal" : "bidirectional", o.p1_only_steps);
  if (o.edit_selected_weight != 1.0) {
    std::cerr << absl::StrFormat(
        "[drafter] edit loss weight %.2f at the slots whose input is the "
        "ground truth\n",
        o.edit_selected_weight);
  }
  if (o.round_anchor_share > 0) {
    std::cerr << absl::StrFormat(
        "[drafter] %.0f%% of the anchors where the drafter's rounds land (%d "
        "rounds from uniform starts)\n",
        100 * o.round_anchor_share, kRoundAnchorWalk);
  }
}

// --init_from's drafter `f` must have the shape asked for (`dc`), except
// that it may have fewer layers.
absl::Status CheckInitShape(const std::string& init_from,
                            const DrafterConfig& f, const DrafterConfig& dc) {
  if (f.layers.num_hidden_layers <= dc.layers.num_hidden_layers &&
      f.layers.hidden_size == dc.layers.hidden_size &&
      f.layers.intermediate_size == dc.layers.intermediate_size &&
      f.layers.num_attention_heads == dc.layers.num_attention_heads &&
      f.layers.num_key_value_heads == dc.layers.num_key_value_heads &&
      f.layers.head_dim == dc.layers.head_dim &&
      f.block_size == dc.block_size &&
      f.target_layer_ids == dc.target_layer_ids &&
      f.num_target_layers == dc.num_target_layers) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "--init_from=%s is a %d-layer drafter (MLP %d, block %d, feature "
      "layers [%s] of a %d-layer target); this run asks for %d layers "
      "(MLP %d, block %d, feature layers [%s] of %d); see %s vs %s",
      init_from, f.layers.num_hidden_layers, f.layers.intermediate_size,
      f.block_size, absl::StrJoin(f.target_layer_ids, ","), f.num_target_layers,
      dc.layers.num_hidden_layers, dc.layers.intermediate_size, dc.block_size,
      absl::StrJoin(dc.target_layer_ids, ","), dc.num_target_layers,
      DrafterConfigToJson(f), DrafterConfigToJson(dc)));
}

// Fresh weights from `dc`, or --init_from's (grown to dc's depth when
// shallower) with dc as its config (passes, editor, mask id) for the export.
absl::StatusOr<TrainableDrafter> InitialDrafter(const DrafterTrainingOptions& o,
                                                const DrafterConfig& dc) {
  if (o.init_from.empty()) return TrainableDrafter::Init(dc, o.seed);
  ASSIGN_OR_RETURN(TrainableDrafter drafter,
                   TrainableDrafter::Load(o.init_from));
  RETURN_IF_ERROR(CheckInitShape(o.init_from, drafter.config(), dc));
  const int from_layers = drafter.config().layers.num_hidden_layers;
  if (from_layers < dc.layers.num_hidden_layers) {
    // Its new layers start as identities (TrainableDrafter::Grow).
    ASSIGN_OR_RETURN(
        drafter,
        TrainableDrafter::Grow(drafter, dc.layers.num_hidden_layers, o.seed));
  }
  drafter.mutable_config() = dc;
  std::cerr << "[drafter] starting from the weights of " << o.init_from;
  if (from_layers < dc.layers.num_hidden_layers) {
    std::cerr << ", grown from " << from_layers << " to "
              << dc.layers.num_hidden_layers << " layers";
  }
  std::cerr << "\n";
  return std::move(drafter);
}

// What one training step computed, for its log record and progress line.
struct StepStats {
  bool joint = false;  // P1 + P2 (else P1 alone)
  int window = 0;
  at::Tensor loss, loss1, loss2;  // loss2: joint steps only
  ProposalMixRates rates;
  double eta = 0, lr = 0, grad_norm = 0;
  // The edit pass's accuracy, and where its input kept P1's guess, the share
  // of wrong guesses it made right and of right ones it made wrong (joint
  // steps only).
  double p2_acc = 0, p2_fixed = 0, p2_broke = 0;
};

void ScoreEditPass(const at::Tensor& logits2, const at::Tensor& y1,
                   const EditInput& edit, const BlockBatch& batch,
                   const at::Tensor& targets, StepStats* s) {
  at::NoGradGuard no_grad;
  const at::Tensor y2 = logits2.argmax(-1);
  at::Tensor hit = y2.eq(targets).logical_and(batch.valid);
  s->p2_acc = hit.sum().item<double>() /
              std::max<double>(1.0, batch.valid.sum().item<double>());
  const at::Tensor kept = batch.valid.logical_and(edit.selected.logical_not());
  const at::Tensor p1_right = y1.eq(targets);
  const double n_kept = std::max<double>(1.0, kept.sum().item<double>());
  s->p2_fixed = kept.logical_and(p1_right.logical_not())
                    .logical_and(hit)
                    .sum()
                    .item<double>() /
                n_kept;
  s->p2_broke = kept.logical_and(p1_right)
                    .logical_and(hit.logical_not())
                    .sum()
                    .item<double>() /
                n_kept;
}

nlohmann::json StepRecord(int64_t step, const StepStats& s) {
  nlohmann::json rec = {{"step", step},
                        {"phase", s.joint ? "joint" : "p1"},
                        {"window", s.window},
                        {"loss", s.loss.item<double>()},
                        {"loss_p1", s.loss1.item<double>()},
                        {"p1_accuracy", s.rates.p1_accuracy},
                        {"gt_selection", s.rates.gt_selection},
                        {"overwrite", s.rates.overwrite},
                        {"eta", s.eta},
                        {"lr", s.lr},
                        {"grad_norm", s.grad_norm}};
  if (s.joint) {
    rec["loss_p2"] = s.loss2.item<double>();
    rec["p2_accuracy"] = s.p2_acc;
    rec["p2_fixed"] = s.p2_fixed;
    rec["p2_broke"] = s.p2_broke;
  }
  return rec;
}

std::string ProgressFields(const StepStats& s) {
  return absl::StrFormat(
      "%s W%d loss P1 %.3f P2 %.3f | P1 acc %.1f%% GT-sel %.1f%% "
      "(eta %.2f) overwrite %.1f%% P2 acc %.1f%% | lr %.2e",
      s.joint ? "joint" : "P1", s.window, s.loss1.item<double>(),
      s.joint ? s.loss2.item<double>() : 0.0, 100 * s.rates.p1_accuracy,
      100 * s.rates.gt_selection, s.eta, 100 * s.rates.overwrite,
      100 * s.p2_acc, s.lr);
}

// Sums over the held-out blocks of one evaluation window.
struct HeldoutTally {
  double accepted[3] = {0, 0, 0};  // draft tokens accepted, P1..P3
  double blocks = 0;
  double slot1_hits = 0, slot1_n = 0;  // P1 at slot 1
  // The neighbour oracle's probe slots: the editor right, P1 right, count.
  double oracle_hits = 0, oracle_p1 = 0, oracle_n = 0;
};

// The editor's input of an oracle probe, [S, NB, W]: the anchor in slot 0;
// block b's probe slot probe[b] (0-based over slots 1..W-1) holds P1's
// argmax `y1`, the slots before it the ground truth, and the slots after it
// the ground truth too, or with `left_only` P1's argmax. *at_probe
// [S, NB, W-1] is true at each block's probe slot.
at::Tensor OracleInput(const BlockBatch& batch, const at::Tensor& y1,
                       const at::Tensor& probe, bool left_only,
                       at::Tensor* at_probe) {
  const int64_t nb = probe.size(0), w = batch.truth.size(-1);
  const at::Tensor truth = batch.truth.narrow(-1, 1, w - 1);
  const at::Tensor slot =
      at::arange(w - 1, at::TensorOptions().dtype(at::kLong)).view({1, w - 1});
  *at_probe =
      slot.eq(probe.view({nb, 1})).view({1, nb, w - 1}).expand_as(truth);
  const at::Tensor keeps_y1 =
      left_only
          ? slot.ge(probe.view({nb, 1})).view({1, nb, w - 1}).expand_as(truth)
          : *at_probe;
  return at::cat({batch.truth.narrow(-1, 0, 1), at::where(keeps_y1, y1, truth)},
                 -1);
}

// The optimisation of one drafter against a frozen target: the drafter and
// its optimizer, the step counter, the P1-only warm-up's state, and the
// state and log files in work_dir. The optimizer points into the drafter,
// so a run is not copied.
class DrafterRun {
 public:
  DrafterRun(const DrafterTrainingOptions& o, const FrozenTarget& target,
             const DrafterConfig& config, const std::vector<int>& windows,
             const DistillData& data, TrainableDrafter drafter);
  DrafterRun(const DrafterRun&) = delete;
  DrafterRun& operator=(const DrafterRun&) = delete;

  // Continues from work_dir's state when there is one (of this run only),
  // and drops the log records written after it.
  absl::Status Resume();
  // Steps until `steps`, or until max_minutes have passed; checkpoints
  // every checkpoint_every_s seconds.
  absl::Status Train();
  absl::Status Save() const;
  int64_t step() const { return step_; }
  const TrainableDrafter& drafter() const { return drafter_; }
  // The editing headroom of `record`'s blocks of `window` anchored every
  // `anchor_stride` positions of its answer (MeasureHeadroom).
  void ScoreHeadroom(const DistillRecord& record, int window, int anchor_stride,
                     SlotHeadroom* tally) const;
  // Every pass's draft and the full neighbour oracle at each anchor of
  // `record`'s answer (DraftBlocks).
  void DraftRecord(const DistillRecord& record, int window, int anchor_stride,
                   int passes, BlockDrafts* out) const;

 private:
  // Forward passes, shared by training and evaluation.
  at::Tensor Features(const at::Tensor& ids) const;
  at::Tensor P1Input(const std::vector<const DistillRecord*>& seqs,
                     const BlockBatch& batch) const;
  at::Tensor Logits(const DrafterContext& ctx, const at::Tensor& tokens,
                    const at::Tensor& anchors, bool edit_pass,
                    const at::Tensor& seeds,
                    at::Tensor* block_share = nullptr) const;
  std::function<at::Tensor(const BlockBatch&)> P1Drafts(
      const std::vector<const DistillRecord*>& seqs,
      const DrafterContext& ctx) const;

  // Training.
  absl::Status TrainStep(ProgressLine* progress);
  void PlaceRoundAnchors(const std::vector<const DistillRecord*>& seqs,
                         const at::Tensor& features, int window,
                         BlockBatch* batch) const;
  StepStats Optimize(const std::vector<const DistillRecord*>& seqs,
                     const BlockBatch& batch, const at::Tensor& features,
                     int window, std::mt19937_64* rng);
  EditInput MakeEditInput(const at::Tensor& logits1, const BlockBatch& batch,
                          const at::Tensor& targets, std::mt19937_64* rng,
                          at::Tensor* y1, double* eta) const;

  // Held-out evaluation.
  void EvaluateHeldout(nlohmann::json* record);
  nlohmann::json Evaluate() const;
  void ScoreHeldoutBlocks(const std::vector<const DistillRecord*>& seqs,
                          int window, std::mt19937_64* rng,
                          HeldoutTally* tally) const;
  void NeighbourOracle(const DrafterContext& ctx, const BlockBatch& batch,
                       int window, const at::Tensor& y1,
                       const at::Tensor& seeds, HeldoutTally* tally) const;
  double RoundsTau(int window, std::mt19937_64* rng) const;
  void ScoreHeadroomBlocks(const std::vector<const DistillRecord*>& seqs,
                           const DrafterContext& ctx, const BlockBatch& batch,
                           SlotHeadroom* tally) const;
  // Calls `fn` on `record`'s blocks anchored every `anchor_stride`
  // positions of its answer, kHeadroomBlocks at a time, with the context
  // computed once.
  void ForEachAnswerChunk(
      const DistillRecord& record, int window, int anchor_stride,
      const std::function<void(const DrafterContext&, const BlockBatch&)>& fn)
      const;
  // The editor's argmax at every slot k, each from its own forward whose
  // input holds P1's argmax `y1` at k and the ground truth at the other
  // slots (left_only: at the slots before k only).
  at::Tensor OracleArgmax(const DrafterContext& ctx, const BlockBatch& batch,
                          const at::Tensor& y1, const at::Tensor& seeds,
                          bool left_only) const;

  const DrafterTrainingOptions& o_;
  const FrozenTarget& target_;
  const DrafterConfig& config_;
  const std::vector<int>& windows_;
  const DistillData& data_;
  // The evaluation windows: 16 when the block is longer, and the block size.
  std::vector<int> eval_windows_;
  TrainableDrafter drafter_;
  AdamW optimizer_;
  const std::string state_path_, log_path_, fingerprint_;
  int64_t step_ = 0;
  // The first joint (P1 + P2) step; lowered to the step where held-out
  // slot-1 accuracy plateaus during the warm-up.
  int64_t joint_from_;
  PlateauRule plateau_;
};

DrafterRun::DrafterRun(const DrafterTrainingOptions& o,
                       const FrozenTarget& target, const DrafterConfig& config,
                       const std::vector<int>& windows, const DistillData& data,
                       TrainableDrafter drafter)
    : o_(o),
      target_(target),
      config_(config),
      windows_(windows),
      data_(data),
      eval_windows_{o.block_size},
      drafter_(std::move(drafter)),
      optimizer_(&drafter_.parameters(), o.adamw),
      state_path_(o.work_dir + "/state.safetensors"),
      log_path_(o.work_dir + "/log.jsonl"),
      fingerprint_(Fingerprint(o, config)),
      joint_from_(o.p1_only_steps),
      plateau_{o.plateau_delta, o.plateau_patience} {
  if (o.block_size > 16) eval_windows_.insert(eval_windows_.begin(), 16);
}

absl::Status DrafterRun::Resume() {
  RETURN_IF_ERROR(MakeDirs(o_.work_dir));
  if (PathExists(state_path_)) {
    std::map<std::string, std::string> meta;
    ASSIGN_OR_RETURN(step_,
                     LoadTrainingState(state_path_, &drafter_.parameters(),
                                       &optimizer_, &meta));
    if (meta["fingerprint"] != fingerprint_) {
      return absl::FailedPreconditionError(absl::StrCat(
          state_path_, " belongs to a different run; use another --work_dir"));
    }
    if (!meta["joint_from"].empty())
      joint_from_ = std::stoll(meta["joint_from"]);
    if (!meta["last_slot1"].empty())
      plateau_.last = std::stod(meta["last_slot1"]);
    if (!meta["flat_evals"].empty())
      plateau_.flat = std::stoll(meta["flat_evals"]);
    std::cerr << "[drafter] resumed at step " << step_ << "\n";
  }
  return DropLogRecordsAfter(log_path_, step_);
}

absl::Status DrafterRun::Save() const {
  return SaveTrainingState(state_path_, drafter_.parameters(), optimizer_,
                           step_,
                           {{"fingerprint", fingerprint_},
                            {"joint_from", absl::StrCat(joint_from_)},
                            {"last_slot1", absl::StrCat(plateau_.last)},
                            {"flat_evals", absl::StrCat(plateau_.flat)}});
}

absl::Status DrafterRun::Train() {
  return GuardTorch([&] {
    return RunSteps(
        "drafter", &step_, o_.steps, o_.max_minutes, o_.checkpoint_every_s,
        [this](ProgressLine* progress) { return TrainStep(progress); },
        [this] { return Save(); });
  });
}

at::Tensor DrafterRun::Features(const at::Tensor& ids) const {
  at::NoGradGuard no_grad;
  at::Tensor features;
  target_.model.Forward(ids, config_.target_layer_ids, &features);
  return features;
}

// P1's block input: masks, or the lookup's proposal when seeded.
at::Tensor DrafterRun::P1Input(const std::vector<const DistillRecord*>& seqs,
                               const BlockBatch& batch) const {
  if (o_.lookup_seed_ngram <= 0) return batch.p1_tokens;
  BlockBatch seeded = batch;
  SeedWithLookup(seqs, o_.lookup_seed_ngram, target_.mask_id, &seeded);
  return seeded.p1_tokens;
}

// `seeds`: P1's block input, whose seed every pass trusts
// (--seed_logit_bonus). The causal editor masks edit passes only.
// `block_share`: as TrainableDrafter::BlockLogits.
at::Tensor DrafterRun::Logits(const DrafterContext& ctx,
                              const at::Tensor& tokens,
                              const at::Tensor& anchors, bool edit_pass,
                              const at::Tensor& seeds,
                              at::Tensor* block_share) const {
  return AddSeedTrust(
      drafter_.BlockLogits(ctx, tokens, anchors, o_.causal_editor && edit_pass,
                           target_.model.embed_tokens(),
                           target_.model.lm_head(), block_share),
      seeds, target_.mask_id, o_.seed_logit_bonus);
}

// P1's greedy drafts of blocks of `seqs` in `ctx`, for the walks of rounds
// (WalkRounds, RoundAnchors); both must outlive the function returned.
std::function<at::Tensor(const BlockBatch&)> DrafterRun::P1Drafts(
    const std::vector<const DistillRecord*>& seqs,
    const DrafterContext& ctx) const {
  return [this, &seqs, &ctx](const BlockBatch& b) {
    const at::Tensor seeds = P1Input(seqs, b);
    return Logits(ctx, seeds, b.anchors, /*edit_pass=*/false, seeds).argmax(-1);
  };
}

absl::Status DrafterRun::TrainStep(ProgressLine* progress) {
  const int w = windows_[step_ % windows_.size()];
  // The batch is a function of (seed, step), so that a resumed run goes on
  // as the uninterrupted one would.
  std::mt19937_64 rng(o_.seed * 0x9e3779b97f4a7c15ull + step_);
  std::uniform_int_distribution<int64_t> pick(0, data_.n_train - 1);
  std::vector<const DistillRecord*> seqs;
  for (int i = 0; i < o_.sequences_per_step; ++i)
    seqs.push_back(&data_.records[pick(rng)]);
  BlockBatch batch = MakeBlockBatch(seqs, o_.blocks_per_sequence, w,
                                    target_.mask_id, target_.eot_id, &rng);
  const at::Tensor features = Features(batch.ids);
  PlaceRoundAnchors(seqs, features, w, &batch);
  const StepStats stats = Optimize(seqs, batch, features, w, &rng);
  ++step_;
  nlohmann::json rec = StepRecord(step_, stats);
  if (!data_.heldout.empty() &&
      (step_ % o_.eval_every == 0 || step_ == o_.steps)) {
    EvaluateHeldout(&rec);
  }
  RETURN_IF_ERROR(AppendToFile(log_path_, rec.dump() + "\n"));
  const int64_t block_tokens =
      int64_t{o_.sequences_per_step} * o_.blocks_per_sequence * w;
  progress->Report(step_, block_tokens, ProgressFields(stats));
  return absl::OkStatus();
}

// With round_anchor_share > 0: the first share of each sequence's uniform
// anchors start walks of the current drafter's rounds, and their blocks
// move to where the walks end.
void DrafterRun::PlaceRoundAnchors(
    const std::vector<const DistillRecord*>& seqs, const at::Tensor& features,
    int window, BlockBatch* batch) const {
  const int round_blocks = static_cast<int>(
      std::lround(o_.round_anchor_share * o_.blocks_per_sequence));
  if (round_blocks <= 0) return;
  std::vector<std::vector<int64_t>> anchors(seqs.size()), starts;
  for (size_t i = 0; i < seqs.size(); ++i) {
    at::Tensor row = batch->anchors[static_cast<int64_t>(i)].contiguous();
    anchors[i].assign(row.data_ptr<int64_t>(),
                      row.data_ptr<int64_t>() + row.numel());
    starts.emplace_back(anchors[i].begin(), anchors[i].begin() + round_blocks);
  }
  at::NoGradGuard no_grad;
  const DrafterContext walk_ctx = drafter_.ProjectContext(features);
  starts =
      RoundAnchors(seqs, std::move(starts), kRoundAnchorWalk, window,
                   target_.mask_id, target_.eot_id, P1Drafts(seqs, walk_ctx));
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::copy(starts[i].begin(), starts[i].end(), anchors[i].begin());
  }
  *batch = MakeBlockBatch(seqs, o_.blocks_per_sequence, window, target_.mask_id,
                          target_.eot_id, nullptr, anchors);
}

// P1 (and in the joint phase P2 on the ProposalMix input), the loss, its
// gradient and the optimizer step.
StepStats DrafterRun::Optimize(const std::vector<const DistillRecord*>& seqs,
                               const BlockBatch& batch,
                               const at::Tensor& features, int window,
                               std::mt19937_64* rng) {
  StepStats s;
  s.joint = step_ >= joint_from_;
  s.window = window;
  const at::Tensor slot_weights = SlotLossWeights(window, o_.gamma);
  const at::Tensor targets = batch.truth.narrow(-1, 1, window - 1);
  const DrafterContext ctx = drafter_.ProjectContext(features);
  // P1 on [anchor, MASK...] (or the lookup's proposal when seeded).
  const at::Tensor seeds = P1Input(seqs, batch);
  const at::Tensor logits1 =
      Logits(ctx, seeds, batch.anchors, /*edit_pass=*/false, seeds);
  s.loss1 = WeightedSlotLoss(logits1, targets, batch.valid, slot_weights);
  // P2 on the ProposalMix input, built from P1 without gradient.
  at::Tensor y1;
  const EditInput edit =
      MakeEditInput(logits1, batch, targets, rng, &y1, &s.eta);
  s.rates = edit.rates;
  s.loss = s.loss1;
  at::Tensor logits2;
  if (s.joint) {
    logits2 = Logits(ctx, edit.tokens, batch.anchors, true, seeds);
    s.loss2 = WeightedSlotLoss(
        logits2, targets, batch.valid,
        o_.edit_selected_weight == 1.0
            ? slot_weights
            : EditLossWeights(slot_weights, edit.selected, batch.valid,
                              o_.edit_selected_weight));
    s.loss = s.loss1 + o_.edit_loss_weight * s.loss2;
  }
  s.loss.backward();
  s.lr = LearningRate(step_, o_.steps, o_.schedule);
  s.grad_norm = optimizer_.Step(s.lr);
  if (s.joint) ScoreEditPass(logits2, y1, edit, batch, targets, &s);
  return s;
}

// The edit pass's input from P1's argmax `y1` and confidence: the ground
// truth where the confidence reaches eta (fixed, adapted to P1's accuracy,
// or with edit_truth_share a uniform draw standing in for the confidence).
EditInput DrafterRun::MakeEditInput(const at::Tensor& logits1,
                                    const BlockBatch& batch,
                                    const at::Tensor& targets,
                                    std::mt19937_64* rng, at::Tensor* y1,
                                    double* eta) const {
  at::NoGradGuard no_grad;
  *eta = o_.eta;
  at::Tensor c1;
  ArgmaxAndConfidence(logits1.detach(), y1, &c1);
  const bool every_block = o_.edit_truth_blocks == 1.0;
  if (o_.edit_truth_share > 0 && every_block) {
    *eta = 1.0 - o_.edit_truth_share;
  } else if (o_.gt_selection_ratio > 0) {
    *eta = AdaptiveEta(*y1, c1, targets, batch.valid, o_.gt_selection_ratio);
  }
  if (o_.edit_truth_share > 0) {
    // A uniform draw per slot stands in for the confidence: the slots whose
    // draw is at or above 1 - share take the ground truth. Shifted so that
    // `eta` selects them (no shift when every block takes them, where eta
    // is 1 - share); with edit_truth_blocks < 1 only the blocks drawn below
    // it take the draws, the others keep P1's confidence against eta.
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    const int64_t slots = c1.size(-1), blocks = c1.numel() / slots;
    std::vector<uint8_t> pick;
    if (!every_block) {
      pick.resize(static_cast<size_t>(blocks));
      for (auto& p : pick) p = u(*rng) < o_.edit_truth_blocks;
    }
    const float shift = static_cast<float>(*eta - (1.0 - o_.edit_truth_share));
    std::vector<float> draw(static_cast<size_t>(c1.numel()));
    for (float& d : draw) d = u(*rng) + shift;
    const at::Tensor draws = at::tensor(draw).view(c1.sizes()).to(c1.device());
    if (every_block) {
      c1 = draws;
    } else {
      const at::Tensor in_truth_block =
          at::tensor(std::vector<int64_t>(pick.begin(), pick.end()))
              .to(at::kBool)
              .view({blocks, 1})
              .expand({blocks, slots})
              .reshape(c1.sizes())
              .to(c1.device());
      c1 = at::where(in_truth_block, draws, c1);
    }
  }
  return BuildEditInput(batch.truth, *y1, c1, batch.valid, *eta,
                        o_.proposal_mix);
}

// Adds the held-out evaluation to `record`, prints it, and ends the P1-only
// warm-up when slot-1 accuracy has stopped rising.
void DrafterRun::EvaluateHeldout(nlohmann::json* record) {
  nlohmann::json ev = Evaluate();
  record->update(ev);
  const std::string bw = absl::StrCat("_w", o_.block_size);
  const double slot1 = ev["heldout_slot1_p1" + bw].get<double>();
  std::cerr << absl::StrFormat(
      "[drafter] step %d held-out W=%d tau P1 %.3f P2 %.3f P3 %.3f | "
      "in rounds, W=%d P1 %.3f | slot-1 P1 %.1f%% | oracle edit %.1f%% "
      "vs P1 %.1f%%\n",
      step_, o_.block_size, ev["heldout_tau_p1" + bw].get<double>(),
      ev["heldout_tau_p2" + bw].get<double>(),
      ev["heldout_tau_p3" + bw].get<double>(), eval_windows_.front(),
      ev[absl::StrCat("heldout_rounds_tau_p1_w", eval_windows_.front())]
          .get<double>(),
      100 * slot1, 100 * ev["oracle_edit_accuracy"].get<double>(),
      100 * ev["oracle_p1_accuracy"].get<double>());
  const double before = plateau_.last;
  if (plateau_.Update(slot1) && step_ < joint_from_) {
    joint_from_ = step_;
    (*record)["joint_from"] = step_;
    std::cerr << absl::StrFormat(
        "[drafter] slot-1 P1 accuracy plateaued (%.1f%% -> %.1f%%, "
        "%d evaluations in a row): joint P1+P2 from step %d\n",
        100 * before, 100 * slot1, o_.plateau_patience, step_);
  }
}

// Held-out: fixed blocks (the same at every evaluation). Per evaluation
// window: tau of P1..P3 drafts against the ground truth, and slot-1 P1
// accuracy; at the smallest window the engine's tau of P1 in rounds; at the
// block size the neighbour oracle.
nlohmann::json DrafterRun::Evaluate() const {
  at::NoGradGuard no_grad;
  nlohmann::json out;
  const std::vector<const DistillRecord*>& heldout = data_.heldout;
  for (int w : eval_windows_) {
    std::mt19937_64 rng(o_.seed ^ 0xe7a1ull);
    HeldoutTally tally;
    for (size_t first = 0; first < heldout.size();
         first += o_.sequences_per_step) {
      const std::vector<const DistillRecord*> seqs(
          heldout.begin() + first,
          heldout.begin() +
              std::min(heldout.size(), first + o_.sequences_per_step));
      ScoreHeldoutBlocks(seqs, w, &rng, &tally);
    }
    const std::string suffix = absl::StrCat("_w", w);
    for (int pass = 0; pass < 3; ++pass) {
      out[absl::StrCat("heldout_tau_p", pass + 1, suffix)] =
          tally.blocks ? 1.0 + tally.accepted[pass] / tally.blocks : 0.0;
    }
    out["heldout_slot1_p1" + suffix] =
        tally.slot1_n ? tally.slot1_hits / tally.slot1_n : 0.0;
    if (w == eval_windows_.front()) {
      out["heldout_rounds_tau_p1" + suffix] = RoundsTau(w, &rng);
    }
    if (w == o_.block_size) {
      out["oracle_edit_accuracy"] =
          tally.oracle_n ? tally.oracle_hits / tally.oracle_n : 0.0;
      out["oracle_p1_accuracy"] =
          tally.oracle_n ? tally.oracle_p1 / tally.oracle_n : 0.0;
    }
  }
  return out;
}

// Blocks of `seqs` at anchors from `rng`: P1..P3 drafts (each edit pass fed
// the previous pass's plain argmax, as at inference), P1 at slot 1, and at
// the block size the neighbour oracle.
void DrafterRun::ScoreHeldoutBlocks(
    const std::vector<const DistillRecord*>& seqs, int window,
    std::mt19937_64* rng, HeldoutTally* tally) const {
  const int w = window;
  BlockBatch batch = MakeBlockBatch(seqs, o_.heldout_blocks_per_sequence, w,
                                    target_.mask_id, target_.eot_id, rng);
  const DrafterContext ctx = drafter_.ProjectContext(Features(batch.ids));
  const at::Tensor truth = batch.truth.narrow(-1, 1, w - 1);
  const at::Tensor seeds = P1Input(seqs, batch);
  at::Tensor input = seeds;
  at::Tensor y1;
  for (int pass = 0; pass < 3; ++pass) {
    at::Tensor tokens =
        Logits(ctx, input, batch.anchors, pass > 0, seeds).argmax(-1);
    if (pass == 0) y1 = tokens;
    tally->accepted[pass] += AcceptedSum(tokens, batch);
    input = at::cat({batch.truth.narrow(-1, 0, 1), tokens}, -1);
  }
  const at::Tensor v1 = batch.valid.select(-1, 0);
  tally->slot1_hits += y1.select(-1, 0)
                           .eq(truth.select(-1, 0))
                           .logical_and(v1)
                           .sum()
                           .item<double>();
  tally->slot1_n += v1.sum().item<double>();
  if (w == o_.block_size) NeighbourOracle(ctx, batch, w, y1, seeds, tally);
  tally->blocks += static_cast<double>(batch.anchors.numel());
}

// The editor at a slot whose other slots hold the ground truth: block b's
// probe slot k = b mod (W-1) holds P1's proposal `y1`, every other slot the
// ground truth; counts the editor's and P1's hits at the probe slots.
void DrafterRun::NeighbourOracle(const DrafterContext& ctx,
                                 const BlockBatch& batch, int window,
                                 const at::Tensor& y1, const at::Tensor& seeds,
                                 HeldoutTally* tally) const {
  const int w = window;
  const int64_t nb = o_.heldout_blocks_per_sequence;
  const at::Tensor truth = batch.truth.narrow(-1, 1, w - 1);
  at::Tensor probe =
      at::arange(nb, at::TensorOptions().dtype(at::kLong)) % (w - 1);
  at::Tensor at_probe;
  at::Tensor oracle_in =
      OracleInput(batch, y1, probe, /*left_only=*/false, &at_probe);
  at::Tensor y2 = Logits(ctx, oracle_in, batch.anchors, true, seeds).argmax(-1);
  at::Tensor counted = at_probe.logical_and(batch.valid);
  tally->oracle_hits += y2.eq(truth).logical_and(counted).sum().item<double>();
  tally->oracle_p1 += y1.eq(truth).logical_and(counted).sum().item<double>();
  tally->oracle_n += counted.sum().item<double>();
}

// The engine's tau (WalkRounds) of P1 over the first 64 held-out answers in
// one batch: a walk takes as many steps as its longest answer has rounds,
// so it covers fewer answers than the block scores.
double DrafterRun::RoundsTau(int window, std::mt19937_64* rng) const {
  const std::vector<const DistillRecord*> seqs(
      data_.heldout.begin(),
      data_.heldout.begin() + std::min<size_t>(data_.heldout.size(), 64));
  const at::Tensor ids =
      MakeBlockBatch(seqs, 1, window, target_.mask_id, target_.eot_id, rng).ids;
  const DrafterContext ctx = drafter_.ProjectContext(Features(ids));
  return WalkRounds(seqs, window, target_.mask_id, target_.eot_id,
                    P1Drafts(seqs, ctx))
      .tau();
}

// Blocks per forward pass of the headroom (a 448-token answer at W=32 is
// 447 blocks; 64 bound the attention scores to a few MB per layer).
constexpr int64_t kHeadroomBlocks = 64;

// Adds `values` [1, NB, W-1], summed over the blocks where `valid`, to the
// per-slot sums `*sums`.
void AddPerSlot(const at::Tensor& values, const at::Tensor& valid,
                std::vector<double>* sums) {
  const at::Tensor per_slot = values.to(at::kDouble)
                                  .masked_fill(valid.logical_not(), 0)
                                  .sum(at::IntArrayRef{0, 1});
  const at::Tensor c = per_slot.contiguous();
  for (size_t k = 0; k < sums->size(); ++k) {
    (*sums)[k] += c.data_ptr<double>()[k];
  }
}

void DrafterRun::ForEachAnswerChunk(
    const DistillRecord& record, int window, int anchor_stride,
    const std::function<void(const DrafterContext&, const BlockBatch&)>& fn)
    const {
  const std::vector<const DistillRecord*> seqs = {&record};
  const int64_t len = static_cast<int64_t>(record.tokens.size());
  std::vector<int64_t> anchors;
  for (int64_t a = record.prompt_len; a <= len - 2; a += anchor_stride) {
    anchors.push_back(a);
  }
  DrafterContext ctx;
  for (size_t first = 0; first < anchors.size(); first += kHeadroomBlocks) {
    const size_t last =
        std::min(anchors.size(), first + static_cast<size_t>(kHeadroomBlocks));
    const std::vector<std::vector<int64_t>> chunk = {
        {anchors.begin() + first, anchors.begin() + last}};
    const BlockBatch batch =
        MakeBlockBatch(seqs, static_cast<int>(last - first), window,
                       target_.mask_id, target_.eot_id, nullptr, chunk);
    if (first == 0) ctx = drafter_.ProjectContext(Features(batch.ids));
    fn(ctx, batch);
  }
}

at::Tensor DrafterRun::OracleArgmax(const DrafterContext& ctx,
                                    const BlockBatch& batch,
                                    const at::Tensor& y1,
                                    const at::Tensor& seeds,
                                    bool left_only) const {
  const int64_t w = batch.truth.size(-1), nb = batch.anchors.size(1);
  at::Tensor out = at::zeros_like(y1);
  for (int64_t k = 0; k < w - 1; ++k) {
    at::Tensor at_probe;
    const at::Tensor input = OracleInput(
        batch, y1, at::full({nb}, k, at::kLong), left_only, &at_probe);
    out = at::where(at_probe,
                    Logits(ctx, input, batch.anchors, true, seeds).argmax(-1),
                    out);
  }
  return out;
}

void DrafterRun::ScoreHeadroom(const DistillRecord& record, int window,
                               int anchor_stride, SlotHeadroom* tally) const {
  at::NoGradGuard no_grad;
  const std::vector<const DistillRecord*> seqs = {&record};
  ForEachAnswerChunk(record, window, anchor_stride,
                     [&](const DrafterContext& ctx, const BlockBatch& batch) {
                       ScoreHeadroomBlocks(seqs, ctx, batch, tally);
                     });
}

// One batch of an answer's blocks: P1, P2 on P1's argmax (both with their
// attention on the block), and at every slot the left and full oracles.
void DrafterRun::ScoreHeadroomBlocks(
    const std::vector<const DistillRecord*>& seqs, const DrafterContext& ctx,
    const BlockBatch& batch, SlotHeadroom* tally) const {
  const int64_t w = batch.truth.size(-1);
  const at::Tensor truth = batch.truth.narrow(-1, 1, w - 1);
  const at::Tensor& valid = batch.valid;
  const at::Tensor seeds = P1Input(seqs, batch);
  at::Tensor share1, share2;
  const at::Tensor y1 =
      Logits(ctx, seeds, batch.anchors, false, seeds, &share1).argmax(-1);
  const at::Tensor y2 =
      Logits(ctx, at::cat({batch.truth.narrow(-1, 0, 1), y1}, -1),
             batch.anchors, true, seeds, &share2)
          .argmax(-1);
  AddPerSlot(at::ones_like(truth), valid, &tally->n);
  AddPerSlot(y1.eq(truth), valid, &tally->p1);
  AddPerSlot(y2.eq(truth), valid, &tally->p2);
  AddPerSlot(share1.narrow(-1, 1, w - 1), valid, &tally->p1_block_share);
  AddPerSlot(share2.narrow(-1, 1, w - 1), valid, &tally->p2_block_share);
  const at::Tensor uniform =
      (static_cast<double>(w) / (batch.anchors.to(at::kDouble) + w))
          .unsqueeze(-1)
          .expand_as(truth);
  AddPerSlot(uniform, valid, &tally->uniform_block_share);
  for (const bool left_only : {true, false}) {
    AddPerSlot(OracleArgmax(ctx, batch, y1, seeds, left_only).eq(truth), valid,
               left_only ? &tally->left_oracle : &tally->full_oracle);
  }
}

void DrafterRun::DraftRecord(const DistillRecord& record, int window,
                             int anchor_stride, int passes,
                             BlockDrafts* out) const {
  at::NoGradGuard no_grad;
  const std::vector<const DistillRecord*> seqs = {&record};
  out->passes.assign(passes, {});
  const auto append = [](const at::Tensor& drafts,
                         std::vector<std::vector<int32_t>>* to) {
    const at::Tensor c = drafts.squeeze(0).to(at::kInt).contiguous();
    for (int64_t b = 0; b < c.size(0); ++b) {
      const int32_t* row = c[b].data_ptr<int32_t>();
      to->emplace_back(row, row + c.size(1));
    }
  };
  ForEachAnswerChunk(
      record, window, anchor_stride,
      [&](const DrafterContext& ctx, const BlockBatch& batch) {
        const at::Tensor a = batch.anchors.squeeze(0).contiguous();
        out->anchors.insert(out->anchors.end(), a.data_ptr<int64_t>(),
                            a.data_ptr<int64_t>() + a.numel());
        const at::Tensor seeds = P1Input(seqs, batch);
        const at::Tensor anchor = batch.truth.narrow(-1, 0, 1);
        at::Tensor input = seeds, y1;
        for (int pass = 0; pass < passes; ++pass) {
          const at::Tensor y =
              Logits(ctx, input, batch.anchors, pass > 0, seeds).argmax(-1);
          if (pass == 0) y1 = y;
          append(y, &out->passes[pass]);
          input = at::cat({anchor, y}, -1);
        }
        append(OracleArgmax(ctx, batch, y1, seeds, /*left_only=*/false),
               &out->oracle);
      });
}

absl::Status ExportDrafter(const DrafterTrainingOptions& o,
                           const TrainableDrafter& drafter) {
  ASSIGN_OR_RETURN(at::ScalarType dtype, ParseScalarType(o.export_dtype));
  ASSIGN_OR_RETURN(std::string tokenizer_json,
                   ReadFileToString(o.target_dir + "/tokenizer.json"));
  RETURN_IF_ERROR(
      drafter.Export(o.out_dir, dtype, {{"tokenizer.json", tokenizer_json}}));
  std::cerr << "[drafter] exported " << o.out_dir << "\n";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StageOutcome> RunDrafterTraining(
    const DrafterTrainingOptions& o) {
  RETURN_IF_ERROR(CheckDrafterOptions(o));
  ASSIGN_OR_RETURN(const FrozenTarget target, LoadFrozenTarget(o.target_dir));
  ASSIGN_OR_RETURN(
      const DrafterConfig config,
      BuildDrafterConfig(o, target.model.config(), target.mask_id));
  ASSIGN_OR_RETURN(const std::vector<int> windows, TrainWindows(o));
  DistillData data;
  RETURN_IF_ERROR(LoadDistillData(o, &data));
  DescribeRun(o, config, windows, data);
  ASSIGN_OR_RETURN(TrainableDrafter drafter, InitialDrafter(o, config));

  DrafterRun run(o, target, config, windows, data, std::move(drafter));
  RETURN_IF_ERROR(run.Resume());
  RETURN_IF_ERROR(run.Train());
  RETURN_IF_ERROR(run.Save());
  if (run.step() < o.steps) {
    std::cerr << "[drafter] time budget used; paused at step " << run.step()
              << " (run the same command again to continue)\n";
    return StageOutcome::kPaused;
  }
  RETURN_IF_ERROR(ExportDrafter(o, run.drafter()));
  return StageOutcome::kFinished;
}

SlotHeadroom::SlotHeadroom(int slots)
    : n(slots),
      p1(slots),
      p2(slots),
      left_oracle(slots),
      full_oracle(slots),
      p1_block_share(slots),
      p2_block_share(slots),
      uniform_block_share(slots) {}

void SlotHeadroom::Add(const SlotHeadroom& other) {
  const auto add = [](std::vector<double>* to, const std::vector<double>& v) {
    if (to->size() < v.size()) to->resize(v.size());
    for (size_t k = 0; k < v.size(); ++k) (*to)[k] += v[k];
  };
  add(&n, other.n);
  add(&p1, other.p1);
  add(&p2, other.p2);
  add(&left_oracle, other.left_oracle);
  add(&full_oracle, other.full_oracle);
  add(&p1_block_share, other.p1_block_share);
  add(&p2_block_share, other.p2_block_share);
  add(&uniform_block_share, other.uniform_block_share);
}

namespace {

// Runs `fn` on a DrafterRun over the drafter exported at `drafter_dir`,
// without data: its forward passes are the held-out evaluation's, with the
// options its config implies (the edit mask as `mask` says).
absl::Status WithEvaluationRun(
    const std::string& target_dir, const std::string& drafter_dir, int window,
    int anchor_stride, const char* what, EditMask mask,
    const std::function<void(const DrafterRun&)>& fn) {
  ASSIGN_OR_RETURN(const FrozenTarget target, LoadFrozenTarget(target_dir));
  ASSIGN_OR_RETURN(TrainableDrafter drafter,
                   TrainableDrafter::Load(drafter_dir));
  const DrafterConfig config = drafter.config();
  RETURN_IF_ERROR(CheckDrafterMatchesTarget(config, target.model.config()));
  if (window < 2 || window > config.block_size || anchor_stride < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": window ", window, " must be in [2, ", config.block_size,
        "] and the anchor stride ", anchor_stride, " at least 1"));
  }
  if (config.mask_token_id != target.mask_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the drafter's mask token is not the target's <|mask|>"));
  }
  DrafterTrainingOptions o;
  o.target_dir = target_dir;
  o.block_size = config.block_size;
  o.causal_editor = mask == EditMask::kAsTrained ? config.causal_editor
                                                 : mask == EditMask::kCausal;
  o.lookup_seed_ngram = config.lookup_seed_ngram;
  o.seed_logit_bonus = config.seed_logit_bonus;
  const std::vector<int> windows = {window};
  const DistillData no_data;
  const DrafterRun run(o, target, config, windows, no_data, std::move(drafter));
  return GuardTorch([&] { fn(run); });
}

}  // namespace

absl::StatusOr<std::vector<SlotHeadroom>> MeasureHeadroom(
    const std::string& target_dir, const std::string& drafter_dir,
    const std::vector<const DistillRecord*>& records, int window,
    int anchor_stride) {
  std::vector<SlotHeadroom> out(records.size(), SlotHeadroom(window - 1));
  RETURN_IF_ERROR(WithEvaluationRun(
      target_dir, drafter_dir, window, anchor_stride, "headroom",
      EditMask::kAsTrained, [&](const DrafterRun& run) {
        for (size_t i = 0; i < records.size(); ++i) {
          run.ScoreHeadroom(*records[i], window, anchor_stride, &out[i]);
        }
      }));
  return out;
}

absl::StatusOr<std::vector<BlockDrafts>> DraftBlocks(
    const std::string& target_dir, const std::string& drafter_dir,
    const std::vector<const DistillRecord*>& records, int window,
    int anchor_stride, int passes, EditMask mask) {
  if (passes < 1 || passes > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("drafts: passes ", passes, " must be in [1, 8]"));
  }
  std::vector<BlockDrafts> out(records.size());
  RETURN_IF_ERROR(WithEvaluationRun(
      target_dir, drafter_dir, window, anchor_stride, "drafts", mask,
      [&](const DrafterRun& run) {
        for (size_t i = 0; i < records.size(); ++i) {
          run.DraftRecord(*records[i], window, anchor_stride, passes, &out[i]);
        }
      }));
  return out;
}

}  // namespace dedit::training
