#include "training/drafter_trainer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "base/model_config.h"
#include "base/status.h"
#include "model/tensor_io.h"
#include "model/torch_status.h"
#include "tokenizer/tokenizer.h"
#include "training/proposal_mix.h"
#include "training/trainable_models.h"

namespace dedit::training {
namespace {

// Greedy proposal and confidence (max softmax probability) per slot.
void ArgmaxAndConfidence(const at::Tensor& logits, at::Tensor* tokens,
                         at::Tensor* confidence) {
  auto [max_logit, argmax] = logits.max(-1);
  *tokens = argmax;
  *confidence = at::exp(logits - max_logit.unsqueeze(-1)).sum(-1).reciprocal();
}

// Leading slots equal to the truth, per block, over blocks whose slots are
// all valid: mean of (accepted + 1).
double MeanAcceptance(const at::Tensor& proposal, const BlockBatch& batch) {
  const int64_t w = batch.truth.size(-1);
  at::Tensor truth = batch.truth.narrow(-1, 1, w - 1);
  at::Tensor correct = proposal.eq(truth).to(at::kLong);
  at::Tensor accepted = correct.cumprod(-1).sum(-1);  // [S, NB]
  at::Tensor full = batch.valid.all(-1);
  const int64_t n = full.sum().item<int64_t>();
  if (n == 0) return 0;
  return 1.0 +
         accepted.masked_select(full).to(at::kDouble).sum().item<double>() / n;
}

std::string Fingerprint(const DrafterTrainingOptions& o,
                        const DrafterConfig& d) {
  return absl::StrCat(
      DrafterConfigToJson(d), " gamma=", o.gamma, " eta=", o.eta,
      " mix=", o.proposal_mix, " causal=", o.causal_editor,
      " edit_w=", o.edit_loss_weight, " S=", o.sequences_per_step,
      " NB=", o.blocks_per_sequence, " steps=", o.steps, " seed=", o.seed,
      " lr=", o.schedule.peak);
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

absl::StatusOr<StageOutcome> RunDrafterTraining(
    const DrafterTrainingOptions& o) {
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
  dc.has_dedit_config = true;
  RETURN_IF_ERROR(CheckDrafterMatchesTarget(dc, tc));

  ASSIGN_OR_RETURN(std::vector<DistillRecord> records,
                   ReadDistillData(o.distill_path));
  records.erase(std::remove_if(records.begin(), records.end(),
                               [](const DistillRecord& r) {
                                 return static_cast<int64_t>(r.tokens.size()) <
                                        r.prompt_len + 2;
                               }),
                records.end());
  const int64_t n_heldout = std::min<int64_t>(
      o.heldout_sequences, static_cast<int64_t>(records.size()) / 10);
  const int64_t n_train = static_cast<int64_t>(records.size()) - n_heldout;
  if (n_train < o.sequences_per_step) {
    return absl::FailedPreconditionError(
        absl::StrCat("only ", records.size(), " usable distilled sequences in ",
                     o.distill_path));
  }
  std::cerr << absl::StrFormat(
      "[drafter] %d train / %d held-out sequences; feature layers [%s]; "
      "ProposalMix %s, %s editor\n",
      n_train, n_heldout, absl::StrJoin(dc.target_layer_ids, ","),
      o.proposal_mix ? "on" : "off",
      o.causal_editor ? "causal" : "bidirectional");

  ASSIGN_OR_RETURN(TrainableDrafter drafter,
                   TrainableDrafter::Init(dc, o.seed));
  AdamW optimizer(&drafter.parameters(), o.adamw);
  const std::string state_path = o.work_dir + "/state.safetensors";
  const std::string log_path = o.work_dir + "/log.jsonl";
  const std::string fingerprint = Fingerprint(o, dc);
  RETURN_IF_ERROR(MakeDirs(o.work_dir));
  int64_t step = 0;
  if (PathExists(state_path)) {
    std::map<std::string, std::string> meta;
    ASSIGN_OR_RETURN(step, LoadTrainingState(state_path, &drafter.parameters(),
                                             &optimizer, &meta));
    if (meta["fingerprint"] != fingerprint) {
      return absl::FailedPreconditionError(absl::StrCat(
          state_path, " belongs to a different run; use another --work_dir"));
    }
    std::cerr << "[drafter] resumed at step " << step << "\n";
  }

  const at::Tensor slot_weights = SlotLossWeights(o.block_size, o.gamma);
  const at::Tensor& embed = target.embed_tokens();
  const at::Tensor& head = target.lm_head();
  auto features_of = [&](const at::Tensor& ids) {
    at::NoGradGuard no_grad;
    at::Tensor features;
    target.Forward(ids, dc.target_layer_ids, &features);
    return features;
  };

  // Held-out: fixed blocks; tau of P1..P3 drafts against the ground truth,
  // each edit pass fed the previous pass's plain argmax (as at inference).
  auto evaluate = [&]() {
    at::NoGradGuard no_grad;
    std::mt19937_64 rng(o.seed ^ 0xe7a1ull);
    std::vector<double> tau_sum(3, 0);
    int64_t batches = 0;
    for (int64_t first = n_train; first < n_train + n_heldout;
         first += o.sequences_per_step) {
      std::vector<const DistillRecord*> seqs;
      for (int64_t i = first;
           i <
           std::min<int64_t>(first + o.sequences_per_step, n_train + n_heldout);
           ++i) {
        seqs.push_back(&records[i]);
      }
      BlockBatch batch = MakeBlockBatch(seqs, o.blocks_per_sequence,
                                        o.block_size, *mask, *eot, &rng);
      DrafterContext ctx = drafter.ProjectContext(features_of(batch.ids));
      at::Tensor input = batch.p1_tokens;
      for (int pass = 0; pass < 3; ++pass) {
        at::Tensor logits = drafter.BlockLogits(ctx, input, batch.anchors,
                                                o.causal_editor, embed, head);
        at::Tensor tokens, conf;
        ArgmaxAndConfidence(logits, &tokens, &conf);
        tau_sum[pass] += MeanAcceptance(tokens, batch);
        input = at::cat({batch.truth.narrow(-1, 0, 1), tokens}, -1);
      }
      ++batches;
    }
    nlohmann::json out;
    for (int pass = 0; pass < 3; ++pass) {
      out[absl::StrCat("heldout_tau_p", pass + 1)] =
          batches ? tau_sum[pass] / batches : 0.0;
    }
    return out;
  };
  auto save = [&]() {
    return SaveTrainingState(state_path, drafter.parameters(), optimizer, step,
                             {{"fingerprint", fingerprint}});
  };

  Deadline deadline(o.max_minutes);
  Every checkpoint(o.checkpoint_every_s);
  ProgressLine progress("drafter", step, o.steps);
  RETURN_IF_ERROR(GuardTorch([&]() -> absl::Status {
    while (step < o.steps) {
      if (deadline.Expired()) break;
      std::mt19937_64 rng(o.seed * 0x9e3779b97f4a7c15ull + step);
      std::uniform_int_distribution<int64_t> pick(0, n_train - 1);
      std::vector<const DistillRecord*> seqs;
      for (int i = 0; i < o.sequences_per_step; ++i)
        seqs.push_back(&records[pick(rng)]);
      BlockBatch batch = MakeBlockBatch(seqs, o.blocks_per_sequence,
                                        o.block_size, *mask, *eot, &rng);
      at::Tensor targets = batch.truth.narrow(-1, 1, o.block_size - 1);
      DrafterContext ctx = drafter.ProjectContext(features_of(batch.ids));
      // P1 on [anchor, MASK...].
      at::Tensor logits1 = drafter.BlockLogits(
          ctx, batch.p1_tokens, batch.anchors, o.causal_editor, embed, head);
      at::Tensor loss1 =
          WeightedSlotLoss(logits1, targets, batch.valid, slot_weights);
      // P2 on the ProposalMix input, built from P1 without gradient.
      EditInput edit;
      {
        at::NoGradGuard no_grad;
        at::Tensor y1, c1;
        ArgmaxAndConfidence(logits1.detach(), &y1, &c1);
        edit = BuildEditInput(batch.truth, y1, c1, batch.valid, o.eta,
                              o.proposal_mix);
      }
      at::Tensor logits2 = drafter.BlockLogits(ctx, edit.tokens, batch.anchors,
                                               o.causal_editor, embed, head);
      at::Tensor loss2 =
          WeightedSlotLoss(logits2, targets, batch.valid, slot_weights);
      at::Tensor loss = loss1 + o.edit_loss_weight * loss2;
      loss.backward();
      const double lr = LearningRate(step, o.steps, o.schedule);
      const double grad_norm = optimizer.Step(lr);
      double p2_acc;
      {
        at::NoGradGuard no_grad;
        at::Tensor hit =
            logits2.argmax(-1).eq(targets).logical_and(batch.valid);
        p2_acc = hit.sum().item<double>() /
                 std::max<double>(1.0, batch.valid.sum().item<double>());
      }
      ++step;
      nlohmann::json rec = {{"step", step},
                            {"loss", loss.item<double>()},
                            {"loss_p1", loss1.item<double>()},
                            {"loss_p2", loss2.item<double>()},
                            {"p1_accuracy", edit.rates.p1_accuracy},
                            {"gt_selection", edit.rates.gt_selection},
                            {"overwrite", edit.rates.overwrite},
                            {"p2_accuracy", p2_acc},
                            {"lr", lr},
                            {"grad_norm", grad_norm}};
      if (n_heldout > 0 && (step % o.eval_every == 0 || step == o.steps)) {
        nlohmann::json ev = evaluate();
        rec.update(ev);
        std::cerr << absl::StrFormat(
            "[drafter] step %d held-out tau P1 %.3f P2 %.3f P3 %.3f\n", step,
            ev["heldout_tau_p1"].get<double>(),
            ev["heldout_tau_p2"].get<double>(),
            ev["heldout_tau_p3"].get<double>());
      }
      RETURN_IF_ERROR(AppendToFile(log_path, rec.dump() + "\n"));
      const int64_t block_tokens =
          int64_t{o.sequences_per_step} * o.blocks_per_sequence * o.block_size;
      progress.Report(
          step, block_tokens,
          absl::StrFormat("loss P1 %.3f P2 %.3f | P1 acc %.1f%% GT-sel %.1f%% "
                          "overwrite %.1f%% P2 acc %.1f%% | lr %.2e",
                          loss1.item<double>(), loss2.item<double>(),
                          100 * edit.rates.p1_accuracy,
                          100 * edit.rates.gt_selection,
                          100 * edit.rates.overwrite, 100 * p2_acc, lr));
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
