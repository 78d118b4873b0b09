#include "training/drafter_trainer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "base/model_config.h"
#include "base/status.h"
#include "engine/ngram_drafter.h"
#include "model/tensor_io.h"
#include "model/torch_status.h"
#include "tokenizer/tokenizer.h"
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

absl::StatusOr<StageOutcome> RunDrafterTraining(
    const DrafterTrainingOptions& o) {
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
  ASSIGN_OR_RETURN(TrainableTarget target, TrainableTarget::Load(o.target_dir));
  target.Freeze();
  ASSIGN_OR_RETURN(auto tokenizer,
                   Tokenizer::FromFile(o.target_dir + "/tokenizer.json"));
  const std::optional<int32_t> mask = tokenizer->TokenToId("<|mask|>");
  const std::optional<int32_t> eot = tokenizer->TokenToId("<|endoftext|>");
  if (!mask || !eot) {
    return absl::InvalidArgumentError(
        "tokenizer needs <|mask|> and <|endoftext|> tokens");
  }
  const Qwen3Config& tc = target.config();
  DrafterConfig dc;
  dc.layers = tc;
  dc.layers.num_hidden_layers = o.num_layers;
  if (o.intermediate_size > 0)
    dc.layers.intermediate_size = o.intermediate_size;
  dc.layers.dtype = "float32";
  dc.block_size = o.block_size;
  dc.mask_token_id = *mask;
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
  const std::vector<int> windows = o.train_windows.empty()
                                       ? std::vector<int>{o.block_size}
                                       : o.train_windows;
  for (int w : windows) {
    if (w < 2 || w > o.block_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("train window ", w, " outside [2, ", o.block_size, "]"));
    }
  }

  auto usable = [](std::vector<DistillRecord>* records) {
    records->erase(
        std::remove_if(records->begin(), records->end(),
                       [](const DistillRecord& r) {
                         return static_cast<int64_t>(r.tokens.size()) <
                                r.prompt_len + 2;
                       }),
        records->end());
  };
  ASSIGN_OR_RETURN(std::vector<DistillRecord> records,
                   ReadDistillData(o.distill_path));
  usable(&records);
  int64_t n_train = static_cast<int64_t>(records.size());
  std::vector<const DistillRecord*> heldout;
  std::vector<DistillRecord> heldout_records;
  if (!o.heldout_path.empty()) {
    ASSIGN_OR_RETURN(heldout_records, ReadDistillData(o.heldout_path));
    usable(&heldout_records);
    for (const DistillRecord& r : heldout_records) heldout.push_back(&r);
  } else {
    const int64_t n = std::min<int64_t>(
        o.heldout_sequences, static_cast<int64_t>(records.size()) / 10);
    n_train -= n;
    for (int64_t i = n_train; i < n_train + n; ++i)
      heldout.push_back(&records[i]);
  }
  if (n_train < o.sequences_per_step) {
    return absl::FailedPreconditionError(
        absl::StrCat("only ", records.size(), " usable distilled sequences in ",
                     o.distill_path));
  }
  std::cerr << absl::StrFormat(
      "[drafter] %d train / %d held-out sequences (%s); feature layers [%s]; "
      "windows [%s]; ProposalMix %s (%s), %s editor; P1-only warm-up up to "
      "%d steps\n",
      n_train, heldout.size(),
      o.heldout_path.empty() ? "last records" : o.heldout_path,
      absl::StrJoin(dc.target_layer_ids, ","), absl::StrJoin(windows, ","),
      o.proposal_mix ? "on" : "off",
      o.edit_truth_share > 0
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

  TrainableDrafter drafter;
  if (o.init_from.empty()) {
    ASSIGN_OR_RETURN(drafter, TrainableDrafter::Init(dc, o.seed));
  } else {
    ASSIGN_OR_RETURN(drafter, TrainableDrafter::Load(o.init_from));
    const DrafterConfig& f = drafter.config();
    if (f.layers.num_hidden_layers > dc.layers.num_hidden_layers ||
        f.layers.hidden_size != dc.layers.hidden_size ||
        f.layers.intermediate_size != dc.layers.intermediate_size ||
        f.layers.num_attention_heads != dc.layers.num_attention_heads ||
        f.layers.num_key_value_heads != dc.layers.num_key_value_heads ||
        f.layers.head_dim != dc.layers.head_dim ||
        f.block_size != dc.block_size ||
        f.target_layer_ids != dc.target_layer_ids ||
        f.num_target_layers != dc.num_target_layers) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--init_from=%s is a %d-layer drafter (MLP %d, block %d, feature "
          "layers [%s] of a %d-layer target); this run asks for %d layers "
          "(MLP %d, block %d, feature layers [%s] of %d); see %s vs %s",
          o.init_from, f.layers.num_hidden_layers, f.layers.intermediate_size,
          f.block_size, absl::StrJoin(f.target_layer_ids, ","),
          f.num_target_layers, dc.layers.num_hidden_layers,
          dc.layers.intermediate_size, dc.block_size,
          absl::StrJoin(dc.target_layer_ids, ","), dc.num_target_layers,
          DrafterConfigToJson(f), DrafterConfigToJson(dc)));
    }
    const int from_layers = f.layers.num_hidden_layers;
    if (from_layers < dc.layers.num_hidden_layers) {
      // A shallower drafter is grown to this run's depth (its new layers
      // start as identities: TrainableDrafter::Grow).
      ASSIGN_OR_RETURN(
          drafter,
          TrainableDrafter::Grow(drafter, dc.layers.num_hidden_layers, o.seed));
    }
    // Its weights, this run's config (passes, editor, mask id) for the
    // export.
    drafter.mutable_config() = dc;
    std::cerr << "[drafter] starting from the weights of " << o.init_from;
    if (from_layers < dc.layers.num_hidden_layers) {
      std::cerr << ", grown from " << from_layers << " to "
                << dc.layers.num_hidden_layers << " layers";
    }
    std::cerr << "\n";
  }
  AdamW optimizer(&drafter.parameters(), o.adamw);
  const std::string state_path = o.work_dir + "/state.safetensors";
  const std::string log_path = o.work_dir + "/log.jsonl";
  const std::string fingerprint = Fingerprint(o, dc);
  RETURN_IF_ERROR(MakeDirs(o.work_dir));
  int64_t step = 0;
  // The first joint (P1 + P2) step; o.steps + 1 while still warming up.
  int64_t joint_from = o.p1_only_steps;
  PlateauRule plateau{o.plateau_delta, o.plateau_patience};
  if (PathExists(state_path)) {
    std::map<std::string, std::string> meta;
    ASSIGN_OR_RETURN(step, LoadTrainingState(state_path, &drafter.parameters(),
                                             &optimizer, &meta));
    if (meta["fingerprint"] != fingerprint) {
      return absl::FailedPreconditionError(absl::StrCat(
          state_path, " belongs to a different run; use another --work_dir"));
    }
    if (!meta["joint_from"].empty())
      joint_from = std::stoll(meta["joint_from"]);
    if (!meta["last_slot1"].empty())
      plateau.last = std::stod(meta["last_slot1"]);
    if (!meta["flat_evals"].empty())
      plateau.flat = std::stoll(meta["flat_evals"]);
    std::cerr << "[drafter] resumed at step " << step << "\n";
  }
  RETURN_IF_ERROR(DropLogRecordsAfter(log_path, step));

  const at::Tensor& embed = target.embed_tokens();
  const at::Tensor& head = target.lm_head();
  auto features_of = [&](const at::Tensor& ids) {
    at::NoGradGuard no_grad;
    at::Tensor features;
    target.Forward(ids, dc.target_layer_ids, &features);
    return features;
  };
  // P1's block input: masks, or the lookup's proposal when seeded.
  auto p1_input = [&](const std::vector<const DistillRecord*>& seqs,
                      const BlockBatch& b) {
    if (o.lookup_seed_ngram <= 0) return b.p1_tokens;
    BlockBatch seeded = b;
    SeedWithLookup(seqs, o.lookup_seed_ngram, *mask, &seeded);
    return seeded.p1_tokens;
  };
  // `seeds`: P1's block input, whose seed every pass trusts
  // (--seed_logit_bonus).
  auto logits_of = [&](const DrafterContext& ctx, const at::Tensor& tokens,
                       const at::Tensor& anchors, bool edit_pass,
                       const at::Tensor& seeds) {
    return AddSeedTrust(
        drafter.BlockLogits(ctx, tokens, anchors, o.causal_editor && edit_pass,
                            embed, head),
        seeds, *mask, o.seed_logit_bonus);
  };

  // Held-out: fixed blocks. Per evaluation window: tau of P1..P3 drafts
  // against the ground truth, each edit pass fed the previous pass's plain
  // argmax (as at inference). At the block size: slot-1 P1 accuracy and the
  // neighbour oracle.
  std::vector<int> eval_windows = {o.block_size};
  if (o.block_size > 16) eval_windows.insert(eval_windows.begin(), 16);
  auto evaluate = [&]() {
    at::NoGradGuard no_grad;
    nlohmann::json out;
    for (int w : eval_windows) {
      std::mt19937_64 rng(o.seed ^ 0xe7a1ull);
      std::vector<double> accepted(3, 0);
      double blocks = 0;
      double slot1_hits = 0, slot1_n = 0, oracle_hits = 0, oracle_p1 = 0,
             oracle_n = 0;
      for (size_t first = 0; first < heldout.size();
           first += o.sequences_per_step) {
        std::vector<const DistillRecord*> seqs(
            heldout.begin() + first,
            heldout.begin() +
                std::min(heldout.size(), first + o.sequences_per_step));
        BlockBatch batch = MakeBlockBatch(seqs, o.heldout_blocks_per_sequence,
                                          w, *mask, *eot, &rng);
        DrafterContext ctx = drafter.ProjectContext(features_of(batch.ids));
        at::Tensor truth = batch.truth.narrow(-1, 1, w - 1);
        const at::Tensor seeds = p1_input(seqs, batch);
        at::Tensor input = seeds;
        at::Tensor y1;
        for (int pass = 0; pass < 3; ++pass) {
          at::Tensor tokens =
              logits_of(ctx, input, batch.anchors, pass > 0, seeds).argmax(-1);
          if (pass == 0) y1 = tokens;
          accepted[pass] += AcceptedSum(tokens, batch);
          input = at::cat({batch.truth.narrow(-1, 0, 1), tokens}, -1);
        }
        at::Tensor v1 = batch.valid.select(-1, 0);
        slot1_hits += y1.select(-1, 0)
                          .eq(truth.select(-1, 0))
                          .logical_and(v1)
                          .sum()
                          .item<double>();
        slot1_n += v1.sum().item<double>();
        if (w == o.block_size) {
          // Neighbour oracle: block b's probe slot k = b mod (W-1) holds P1's
          // proposal, every other slot the ground truth.
          const int64_t nb = o.heldout_blocks_per_sequence;
          at::Tensor probe =
              at::arange(nb, at::TensorOptions().dtype(at::kLong)) % (w - 1);
          at::Tensor at_probe =
              at::arange(w - 1, at::TensorOptions().dtype(at::kLong))
                  .view({1, w - 1})
                  .eq(probe.view({nb, 1}))
                  .view({1, nb, w - 1})
                  .expand_as(truth);
          at::Tensor oracle_in = at::cat(
              {batch.truth.narrow(-1, 0, 1), at::where(at_probe, y1, truth)},
              -1);
          at::Tensor y2 =
              logits_of(ctx, oracle_in, batch.anchors, true, seeds).argmax(-1);
          at::Tensor counted = at_probe.logical_and(batch.valid);
          oracle_hits += y2.eq(truth).logical_and(counted).sum().item<double>();
          oracle_p1 += y1.eq(truth).logical_and(counted).sum().item<double>();
          oracle_n += counted.sum().item<double>();
        }
        blocks += static_cast<double>(batch.anchors.numel());
      }
      const std::string suffix = absl::StrCat("_w", w);
      for (int pass = 0; pass < 3; ++pass) {
        out[absl::StrCat("heldout_tau_p", pass + 1, suffix)] =
            blocks ? 1.0 + accepted[pass] / blocks : 0.0;
      }
      out["heldout_slot1_p1" + suffix] = slot1_n ? slot1_hits / slot1_n : 0.0;
      if (w == eval_windows.front()) {
        // The engine's tau (WalkRounds) of P1 at the smallest window, over
        // the first 64 held-out answers in one batch: a walk takes as many
        // steps as its longest answer has rounds (~25 s a walk on one core).
        std::vector<const DistillRecord*> seqs(
            heldout.begin(),
            heldout.begin() + std::min<size_t>(heldout.size(), 64));
        at::Tensor ids = MakeBlockBatch(seqs, 1, w, *mask, *eot, &rng).ids;
        DrafterContext ctx = drafter.ProjectContext(features_of(ids));
        out["heldout_rounds_tau_p1" + suffix] =
            WalkRounds(seqs, w, *mask, *eot, [&](const BlockBatch& b) {
              const at::Tensor seeds = p1_input(seqs, b);
              return logits_of(ctx, seeds, b.anchors, false, seeds).argmax(-1);
            }).tau();
      }
      if (w == o.block_size) {
        out["oracle_edit_accuracy"] = oracle_n ? oracle_hits / oracle_n : 0.0;
        out["oracle_p1_accuracy"] = oracle_n ? oracle_p1 / oracle_n : 0.0;
      }
    }
    return out;
  };
  auto save = [&]() {
    return SaveTrainingState(state_path, drafter.parameters(), optimizer, step,
                             {{"fingerprint", fingerprint},
                              {"joint_from", absl::StrCat(joint_from)},
                              {"last_slot1", absl::StrCat(plateau.last)},
                              {"flat_evals", absl::StrCat(plateau.flat)}});
  };

  Deadline deadline(o.max_minutes);
  Every checkpoint(o.checkpoint_every_s);
  ProgressLine progress("drafter", step, o.steps);
  RETURN_IF_ERROR(GuardTorch([&]() -> absl::Status {
    while (step < o.steps) {
      if (deadline.Expired()) break;
      const bool joint = step >= joint_from;
      const int w = windows[step % windows.size()];
      const at::Tensor slot_weights = SlotLossWeights(w, o.gamma);
      std::mt19937_64 rng(o.seed * 0x9e3779b97f4a7c15ull + step);
      std::uniform_int_distribution<int64_t> pick(0, n_train - 1);
      std::vector<const DistillRecord*> seqs;
      for (int i = 0; i < o.sequences_per_step; ++i)
        seqs.push_back(&records[pick(rng)]);
      BlockBatch batch =
          MakeBlockBatch(seqs, o.blocks_per_sequence, w, *mask, *eot, &rng);
      const at::Tensor features = features_of(batch.ids);
      const int round_blocks = static_cast<int>(
          std::lround(o.round_anchor_share * o.blocks_per_sequence));
      if (round_blocks > 0) {
        // The first round_blocks uniform anchors of each sequence start
        // walks of the current drafter's rounds; the blocks go where the
        // walks end.
        std::vector<std::vector<int64_t>> anchors(seqs.size()), starts;
        for (size_t i = 0; i < seqs.size(); ++i) {
          at::Tensor row = batch.anchors[static_cast<int64_t>(i)].contiguous();
          anchors[i].assign(row.data_ptr<int64_t>(),
                            row.data_ptr<int64_t>() + row.numel());
          starts.emplace_back(anchors[i].begin(),
                              anchors[i].begin() + round_blocks);
        }
        at::NoGradGuard no_grad;
        const DrafterContext walk_ctx = drafter.ProjectContext(features);
        starts = RoundAnchors(seqs, std::move(starts), kRoundAnchorWalk, w,
                              *mask, *eot, [&](const BlockBatch& b) {
                                const at::Tensor seeds = p1_input(seqs, b);
                                return logits_of(walk_ctx, seeds, b.anchors,
                                                 false, seeds)
                                    .argmax(-1);
                              });
        for (size_t i = 0; i < seqs.size(); ++i) {
          std::copy(starts[i].begin(), starts[i].end(), anchors[i].begin());
        }
        batch = MakeBlockBatch(seqs, o.blocks_per_sequence, w, *mask, *eot,
                               nullptr, anchors);
      }
      at::Tensor targets = batch.truth.narrow(-1, 1, w - 1);
      DrafterContext ctx = drafter.ProjectContext(features);
      // P1 on [anchor, MASK...] (or the lookup's proposal when seeded).
      const at::Tensor seeds = p1_input(seqs, batch);
      at::Tensor logits1 =
          logits_of(ctx, seeds, batch.anchors, /*edit_pass=*/false, seeds);
      at::Tensor loss1 =
          WeightedSlotLoss(logits1, targets, batch.valid, slot_weights);
      // P2 on the ProposalMix input, built from P1 without gradient.
      EditInput edit;
      double eta = o.eta;
      at::Tensor y1;
      {
        at::NoGradGuard no_grad;
        at::Tensor c1;
        ArgmaxAndConfidence(logits1.detach(), &y1, &c1);
        if (o.edit_truth_share > 0) {
          // A uniform draw per slot stands in for the confidence: the
          // slots at or above 1 - share take the ground truth.
          std::uniform_real_distribution<float> u(0.0f, 1.0f);
          std::vector<float> draw(static_cast<size_t>(c1.numel()));
          for (float& d : draw) d = u(rng);
          c1 = at::tensor(draw).view(c1.sizes());
          eta = 1.0 - o.edit_truth_share;
        } else if (o.gt_selection_ratio > 0) {
          eta = AdaptiveEta(y1, c1, targets, batch.valid, o.gt_selection_ratio);
        }
        edit = BuildEditInput(batch.truth, y1, c1, batch.valid, eta,
                              o.proposal_mix);
      }
      at::Tensor loss = loss1, loss2, logits2;
      if (joint) {
        logits2 = logits_of(ctx, edit.tokens, batch.anchors, true, seeds);
        loss2 = WeightedSlotLoss(
            logits2, targets, batch.valid,
            o.edit_selected_weight == 1.0
                ? slot_weights
                : EditLossWeights(slot_weights, edit.selected, batch.valid,
                                  o.edit_selected_weight));
        loss = loss1 + o.edit_loss_weight * loss2;
      }
      loss.backward();
      const double lr = LearningRate(step, o.steps, o.schedule);
      const double grad_norm = optimizer.Step(lr);
      double p2_acc = 0, p2_fixed = 0, p2_broke = 0;
      if (joint) {
        at::NoGradGuard no_grad;
        const at::Tensor y2 = logits2.argmax(-1);
        at::Tensor hit = y2.eq(targets).logical_and(batch.valid);
        p2_acc = hit.sum().item<double>() /
                 std::max<double>(1.0, batch.valid.sum().item<double>());
        // Where the input kept P1's guess: what the edit pass made of it.
        const at::Tensor kept =
            batch.valid.logical_and(edit.selected.logical_not());
        const at::Tensor p1_right = y1.eq(targets);
        const double n_kept = std::max<double>(1.0, kept.sum().item<double>());
        p2_fixed = kept.logical_and(p1_right.logical_not())
                       .logical_and(hit)
                       .sum()
                       .item<double>() /
                   n_kept;
        p2_broke = kept.logical_and(p1_right)
                       .logical_and(hit.logical_not())
                       .sum()
                       .item<double>() /
                   n_kept;
      }
      ++step;
      nlohmann::json rec = {{"step", step},
                            {"phase", joint ? "joint" : "p1"},
                            {"window", w},
                            {"loss", loss.item<double>()},
                            {"loss_p1", loss1.item<double>()},
                            {"p1_accuracy", edit.rates.p1_accuracy},
                            {"gt_selection", edit.rates.gt_selection},
                            {"overwrite", edit.rates.overwrite},
                            {"eta", eta},
                            {"lr", lr},
                            {"grad_norm", grad_norm}};
      if (joint) {
        rec["loss_p2"] = loss2.item<double>();
        rec["p2_accuracy"] = p2_acc;
        rec["p2_fixed"] = p2_fixed;
        rec["p2_broke"] = p2_broke;
      }
      if (!heldout.empty() && (step % o.eval_every == 0 || step == o.steps)) {
        nlohmann::json ev = evaluate();
        rec.update(ev);
        const std::string bw = absl::StrCat("_w", o.block_size);
        const double slot1 = ev["heldout_slot1_p1" + bw].get<double>();
        std::cerr << absl::StrFormat(
            "[drafter] step %d held-out W=%d tau P1 %.3f P2 %.3f P3 %.3f | "
            "in rounds, W=%d P1 %.3f | slot-1 P1 %.1f%% | oracle edit %.1f%% "
            "vs P1 %.1f%%\n",
            step, o.block_size, ev["heldout_tau_p1" + bw].get<double>(),
            ev["heldout_tau_p2" + bw].get<double>(),
            ev["heldout_tau_p3" + bw].get<double>(), eval_windows.front(),
            ev[absl::StrCat("heldout_rounds_tau_p1_w", eval_windows.front())]
                .get<double>(),
            100 * slot1, 100 * ev["oracle_edit_accuracy"].get<double>(),
            100 * ev["oracle_p1_accuracy"].get<double>());
        // The warm-up ends when slot-1 accuracy stops rising.
        const double before = plateau.last;
        if (plateau.Update(slot1) && step < joint_from) {
          joint_from = step;
          rec["joint_from"] = step;
          std::cerr << absl::StrFormat(
              "[drafter] slot-1 P1 accuracy plateaued (%.1f%% -> %.1f%%, "
              "%d evaluations in a row): joint P1+P2 from step %d\n",
              100 * before, 100 * slot1, o.plateau_patience, step);
        }
      }
      RETURN_IF_ERROR(AppendToFile(log_path, rec.dump() + "\n"));
      const int64_t block_tokens =
          int64_t{o.sequences_per_step} * o.blocks_per_sequence * w;
      progress.Report(
          step, block_tokens,
          absl::StrFormat(
              "%s W%d loss P1 %.3f P2 %.3f | P1 acc %.1f%% GT-sel %.1f%% "
              "(eta %.2f) overwrite %.1f%% P2 acc %.1f%% | lr %.2e",
              joint ? "joint" : "P1", w, loss1.item<double>(),
              joint ? loss2.item<double>() : 0.0, 100 * edit.rates.p1_accuracy,
              100 * edit.rates.gt_selection, eta, 100 * edit.rates.overwrite,
              100 * p2_acc, lr));
      if (checkpoint.Due()) RETURN_IF_ERROR(save());
    }
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(save());
  if (step < o.steps) {
    std::cerr << "[drafter] time budget used; paused at step " << step
              << " (run the same command again to continue)\n";
    return StageOutcome::kPaused;
  }
  ASSIGN_OR_RETURN(at::ScalarType dtype, ParseScalarType(o.export_dtype));
  ASSIGN_OR_RETURN(std::string tokenizer_json,
                   ReadFileToString(o.target_dir + "/tokenizer.json"));
  RETURN_IF_ERROR(
      drafter.Export(o.out_dir, dtype, {{"tokenizer.json", tokenizer_json}}));
  std::cerr << "[drafter] exported " << o.out_dir << "\n";
  return StageOutcome::kFinished;
}

}  // namespace dedit::training
