// dedit-train: trains a tokenizer, a Qwen3 target and a DEdit drafter, and
// evaluates the pair in the engine. Flags only; the work is in the stage
// libraries (training/*.h).
//
//   dedit-train tokenizer --out=tok.json --vocab_size=2048
//   dedit-train target    --tokenizer=tok.json --work_dir=w/target
//   --out=m/target dedit-train distill   --target=m/target --work_dir=w/target
//   --out=w/distill.bin dedit-train drafter   --target=m/target
//   --data=w/distill.bin
//                         --work_dir=w/drafter --out=m/drafter
//   dedit-train eval      --target=m/target --drafter=m/drafter --report=r.json
//   dedit-train headroom  --target=m/target --drafter=m/drafter
//                         --data=w/distill-heldout.bin
//                         --chat_prompts=tasks/heldout.jsonl --report=h.json
//   dedit-train drafts    --target=m/target --drafter=m/drafter
//                         --data=toy/heldout.bin --report=drafts.jsonl
//   dedit-train widen     --from=m/target --out=wide/target --factor=8
//   dedit-train widen-check --target=m/target --wide=wide/target
//                         --chat_prompts=tasks/heldout.jsonl
//
// Every training stage checkpoints and resumes: rerunning the same command
// continues. Exit status: 0 done, 75 stopped by --max_minutes (rerun to
// continue), 1 error, 2 usage.
#include <ATen/Parallel.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/file_util.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/cpu/cpu_threads.h"
#include "common/model/qwen3_model.h"
#include "common/tokenizer/tokenizer.h"
#include "training/bpe_trainer.h"
#include "training/corpus.h"
#include "training/distill.h"
#include "training/drafter_trainer.h"
#include "training/evaluation.h"
#include "training/greedy_agreement.h"
#include "training/headroom.h"
#include "training/progress.h"
#include "training/target_trainer.h"
#include "training/widen.h"

// Shared.
ABSL_FLAG(std::string, corpus_roots,
          "/usr/lib/python3.11,/usr/share/doc/python3.11/html/_sources",
          "comma-separated corpus directories");
ABSL_FLAG(std::string, corpus_suffixes, ".py,.rst.txt",
          "file name endings taken from the corpus roots");
ABSL_FLAG(int, heldout_every, 20, "1 file in N (by path hash) is held out");
ABSL_FLAG(std::string, work_dir, "", "caches, checkpoint state and logs");
ABSL_FLAG(std::string, out, "",
          "output: tokenizer.json, model folder or data file");
ABSL_FLAG(uint64_t, seed, 1, "seed of the weights and of the batch order");
ABSL_FLAG(int, threads, 0, "intra-op threads (0 = libtorch default)");
ABSL_FLAG(double, max_minutes, 0,
          "stop at a checkpoint after this long (0 = no limit)");
ABSL_FLAG(double, checkpoint_every_s, 300, "seconds between checkpoints");
ABSL_FLAG(std::string, export_dtype, "bfloat16", "dtype of exported weights");
ABSL_FLAG(int64_t, steps, 2000, "optimizer steps");
ABSL_FLAG(double, lr, 1e-3, "peak learning rate");
ABSL_FLAG(double, warmup, 0.04, "warmup fraction of the steps");
ABSL_FLAG(double, weight_decay, 0.1, "AdamW decoupled weight decay (matrices)");
ABSL_FLAG(int, eval_every, 250, "held-out evaluation every N steps");
// tokenizer
ABSL_FLAG(int, vocab_size, 2048, "tokenizer: ids including special tokens");
// target
ABSL_FLAG(std::string, tokenizer, "", "target: tokenizer.json");
ABSL_FLAG(int, hidden_size, 192, "target: hidden size");
ABSL_FLAG(int, intermediate_size, 512, "target: MLP size");
ABSL_FLAG(int, num_layers, 4, "target: decoder layers");
ABSL_FLAG(int, num_heads, 6, "target: attention heads");
ABSL_FLAG(int, num_kv_heads, 2, "target: key/value heads");
ABSL_FLAG(int, head_dim, 32, "target: head dimension");
ABSL_FLAG(double, rope_theta, 10000.0, "target: RoPE theta");
ABSL_FLAG(int, seq_len, 256, "target: training window");
ABSL_FLAG(std::string, init_from, "",
          "target / drafter: start from this exported model's weights "
          "(fresh optimizer and schedule), e.g. to train a shipped model "
          "further; a target with fewer layers than --num_layers is grown, "
          "its new layers adding nothing until trained; so is a drafter with "
          "fewer layers than --drafter_layers (any other shape must match)");
ABSL_FLAG(int64_t, reschedule_from_steps, 0,
          "target: resume a state saved by the same run with --steps=N "
          "(this N) on a schedule of --steps instead, e.g. to finish sooner");
ABSL_FLAG(int, max_positions, 0,
          "target: exported context (max_position_embeddings); 0 = seq_len");
ABSL_FLAG(std::string, chat_tasks, "",
          "target: chat task suite folder (train.jsonl, heldout.jsonl from "
          "training/chat_tasks.py generate); empty = corpus only");
ABSL_FLAG(double, chat_fraction, 0.5,
          "target: share of each batch's windows taken from the chat tasks; "
          "distill: share of the records prompted with --chat_prompts");
ABSL_FLAG(std::string, chat_prompts, "",
          "distill: a chat task jsonl (training/chat_tasks.py) whose prompts "
          "the target answers; empty = corpus windows only; widen-check: "
          "the prompts both targets decode; headroom: the tasks whose "
          "prompts --data answers (gives each answer its family)");
ABSL_FLAG(int, batch_size, 16, "target: windows per step");
// distill / drafter / eval
ABSL_FLAG(std::string, target, "",
          "exported target folder (widen-check: the reference)");
ABSL_FLAG(int, num_sequences, 2048, "distill: sequences to generate");
ABSL_FLAG(int, prompt_min, 16, "distill: shortest prompt (tokens)");
ABSL_FLAG(int, prompt_max, 96, "distill: longest prompt (tokens)");
ABSL_FLAG(int, continuation, 160, "distill: greedy tokens per prompt");
ABSL_FLAG(int, distill_batch, 32, "distill: sequences decoded together");
ABSL_FLAG(std::string, data, "",
          "drafter: distilled data file, or a comma-separated list of them "
          "read in order; headroom: the answers scored");
ABSL_FLAG(int, drafter_layers, 1, "drafter: decoder layers");
ABSL_FLAG(int, drafter_intermediate, 0, "drafter: MLP size (0 = target's)");
ABSL_FLAG(int, block_size, 16, "drafter: block size W");
ABSL_FLAG(std::string, target_layer_ids, "",
          "drafter: comma-separated feature layers (empty = default for 3)");
ABSL_FLAG(int, num_passes, 3, "drafter: default passes K in its config");
ABSL_FLAG(double, gamma, 7.0, "drafter: slot loss decay exp(-(k-1)/gamma)");
ABSL_FLAG(double, eta, 0.5, "drafter: ProposalMix confidence threshold");
ABSL_FLAG(bool, proposal_mix, true,
          "drafter: ProposalMix (false = P2 on plain P1 argmax)");
ABSL_FLAG(bool, causal_editor, false, "drafter: causal mask inside the block");
ABSL_FLAG(double, edit_loss_weight, 1.0, "drafter: weight of the P2 loss");
ABSL_FLAG(double, edit_selected_weight, 1.0,
          "drafter: P2 loss weight at the slots whose ProposalMix input is "
          "the ground truth (0 = train the editor only where its input is "
          "P1's own guess)");
ABSL_FLAG(double, edit_truth_share, 0,
          "drafter: > 0 puts the ground truth at this random share of the "
          "edit pass's slots instead of P1's confident ones (eta and "
          "--gt_selection_ratio unused)");
ABSL_FLAG(double, edit_truth_blocks, 1.0,
          "drafter: with --edit_truth_share, the share of blocks that take "
          "it; the others keep ProposalMix by P1's confidence (1 = all)");
ABSL_FLAG(int, sequences_per_step, 4, "drafter: sequences per step");
ABSL_FLAG(int, blocks_per_sequence, 32, "drafter: blocks per sequence");
ABSL_FLAG(std::string, train_windows, "",
          "drafter: block lengths cycled per step, each <= --block_size "
          "(empty = the block size)");
ABSL_FLAG(int, lookup_seed_ngram, 0,
          "drafter: P1 reads the prompt lookup's proposal (suffixes of at "
          "least this many tokens) instead of masks; 0 = off");
ABSL_FLAG(double, seed_logit_bonus, 0,
          "drafter: trust in the seed (dedit_config.seed_logit_bonus, "
          "needs --lookup_seed_ngram) in every pass during training and "
          "in the export; 0 = none (fit it after training)");
ABSL_FLAG(double, round_anchor_share, 0,
          "drafter: share of each sequence's anchors placed where the "
          "current drafter's rounds land (on-policy), the rest uniform");
ABSL_FLAG(double, gt_selection_ratio, 0,
          "drafter: adaptive ProposalMix eta per batch, ground truth "
          "selected for this ratio x P1 accuracy (0 = fixed --eta)");
ABSL_FLAG(int64_t, p1_only_steps, 0,
          "drafter: longest P1-only warm-up (ends early when held-out "
          "slot-1 accuracy gains less than --plateau_delta per evaluation)");
ABSL_FLAG(double, plateau_delta, 0.01,
          "drafter: slot-1 accuracy gain per evaluation that ends the warm-up");
ABSL_FLAG(int, plateau_patience, 2,
          "drafter: evaluations in a row under --plateau_delta that end the "
          "warm-up");
ABSL_FLAG(std::string, heldout_data, "",
          "drafter: held-out distilled data (held-out files and values); "
          "empty = the last records of --data");
ABSL_FLAG(int, heldout_blocks, 16, "drafter: held-out blocks per sequence");
ABSL_FLAG(std::string, drafter, "", "eval, headroom, drafts: drafter folder");
ABSL_FLAG(int, num_prompts, 16, "eval: held-out prompts");
ABSL_FLAG(int, prompt_tokens, 64, "eval: prompt length");
ABSL_FLAG(int, max_new_tokens, 128,
          "eval, widen-check: tokens generated per prompt");
ABSL_FLAG(int, window, 16, "eval, headroom, drafts: block size W");
ABSL_FLAG(int, anchor_stride, 1,
          "headroom, drafts: a block at every Nth position of each answer");
ABSL_FLAG(int, max_instances, 0,
          "headroom: score the first N distinct answers only; drafts: the "
          "first N records (0 = all)");
ABSL_FLAG(int, draft_passes, 4, "drafts: passes drafted at each anchor");
ABSL_FLAG(std::string, edit_mask, "as_trained",
          "drafts: the edit passes' mask: as_trained (the drafter's config), "
          "causal or bidirectional (the ablation on the same weights)");
ABSL_FLAG(std::string, passes, "1,2,3,4", "eval: pass counts K");
ABSL_FLAG(bool, causal_too, true, "eval: also run the causal editor");
ABSL_FLAG(std::string, report, "",
          "eval, widen-check, headroom: write the JSON report here; drafts: "
          "the JSON lines");
ABSL_FLAG(
    std::string, prompt_split, "heldout",
    "eval: prompts from 'heldout' files (reported) or 'train' (diagnosis)");
// widen / widen-check
ABSL_FLAG(std::string, from, "",
          "widen: the model folder to widen (a Qwen3ForCausalLM target or a "
          "DFlashDraftModel drafter, told apart by config.json)");
ABSL_FLAG(int, factor, 8,
          "widen: width factor F, 1..64 (hidden, heads, KV heads and MLP x F; "
          "F^2 the weight bytes); exact in bf16 when F is a power of two, "
          "any other F rounds each scaled weight once");
ABSL_FLAG(std::string, wide, "",
          "widen-check: the widened target, decoded against --target");
ABSL_FLAG(std::string, check_products, "auto",
          "widen-check: CPU product kernel of both models (auto, bf16, f32, "
          "blas; common/model/cpu/cpu_panels.h)");

namespace {

using namespace dedit::training;  // NOLINT: binary-local convenience

int Fail(const absl::Status& status) {
  std::cerr << "dedit-train: " << status << "\n";
  return 1;
}

int OutcomeCode(const absl::StatusOr<StageOutcome>& outcome) {
  if (!outcome.ok()) return Fail(outcome.status());
  return *outcome == StageOutcome::kFinished ? 0 : 75;
}

std::vector<int> IntList(const std::string& text) {
  std::vector<int> out;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v;
    if (absl::SimpleAtoi(piece, &v)) out.push_back(v);
  }
  return out;
}

CorpusSpec CorpusFromFlags() {
  CorpusSpec spec;
  spec.roots =
      absl::StrSplit(absl::GetFlag(FLAGS_corpus_roots), ',', absl::SkipEmpty());
  spec.suffixes = absl::StrSplit(absl::GetFlag(FLAGS_corpus_suffixes), ',',
                                 absl::SkipEmpty());
  spec.heldout_every = absl::GetFlag(FLAGS_heldout_every);
  return spec;
}

LearningRateSchedule ScheduleFromFlags() {
  LearningRateSchedule s;
  s.peak = absl::GetFlag(FLAGS_lr);
  s.warmup_fraction = absl::GetFlag(FLAGS_warmup);
  return s;
}

AdamWOptions AdamWFromFlags() {
  AdamWOptions a;
  a.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  return a;
}

// The optimisation loop's flags, shared by the target and drafter stages
// (their option structs name these fields alike).
template <typename Options>
void FillTrainingLoop(Options& o) {
  o.steps = absl::GetFlag(FLAGS_steps);
  o.schedule = ScheduleFromFlags();
  o.adamw = AdamWFromFlags();
  o.seed = absl::GetFlag(FLAGS_seed);
  o.checkpoint_every_s = absl::GetFlag(FLAGS_checkpoint_every_s);
  o.max_minutes = absl::GetFlag(FLAGS_max_minutes);
  o.eval_every = absl::GetFlag(FLAGS_eval_every);
  o.export_dtype = absl::GetFlag(FLAGS_export_dtype);
}

bool Require(const std::vector<std::pair<const char*, std::string>>& flags) {
  bool ok = true;
  for (const auto& [name, value] : flags) {
    if (value.empty()) {
      std::cerr << "dedit-train: --" << name << " is required\n";
      ok = false;
    }
  }
  return ok;
}

int RunTokenizer() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!Require({{"out", out}})) return 2;
  BpeTrainerOptions options;
  options.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  absl::Status status = TrainCorpusTokenizer(CorpusFromFlags(), options, out);
  return status.ok() ? 0 : Fail(status);
}

int RunTarget() {
  TargetTrainingOptions o;
  o.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  o.work_dir = absl::GetFlag(FLAGS_work_dir);
  o.out_dir = absl::GetFlag(FLAGS_out);
  if (!Require({{"tokenizer", o.tokenizer_path},
                {"work_dir", o.work_dir},
                {"out", o.out_dir}})) {
    return 2;
  }
  o.corpus = CorpusFromFlags();
  o.model.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  o.model.intermediate_size = absl::GetFlag(FLAGS_intermediate_size);
  o.model.num_hidden_layers = absl::GetFlag(FLAGS_num_layers);
  o.model.num_attention_heads = absl::GetFlag(FLAGS_num_heads);
  o.model.num_key_value_heads = absl::GetFlag(FLAGS_num_kv_heads);
  o.model.head_dim = absl::GetFlag(FLAGS_head_dim);
  o.model.rope_theta = absl::GetFlag(FLAGS_rope_theta);
  o.model.rms_norm_eps = 1e-6;
  o.model.tie_word_embeddings = true;
  o.seq_len = absl::GetFlag(FLAGS_seq_len);
  o.max_positions = absl::GetFlag(FLAGS_max_positions);
  o.init_from = absl::GetFlag(FLAGS_init_from);
  o.reschedule_from_steps = absl::GetFlag(FLAGS_reschedule_from_steps);
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.chat_tasks_dir = absl::GetFlag(FLAGS_chat_tasks);
  o.chat_fraction = absl::GetFlag(FLAGS_chat_fraction);
  FillTrainingLoop(o);
  return OutcomeCode(RunTargetTraining(o));
}

int RunDistillStage() {
  DistillOptions o;
  o.target_dir = absl::GetFlag(FLAGS_target);
  o.work_dir = absl::GetFlag(FLAGS_work_dir);
  o.out_path = absl::GetFlag(FLAGS_out);
  if (!Require({{"target", o.target_dir},
                {"work_dir", o.work_dir},
                {"out", o.out_path}})) {
    return 2;
  }
  o.corpus = CorpusFromFlags();
  o.num_sequences = absl::GetFlag(FLAGS_num_sequences);
  o.prompt_min_tokens = absl::GetFlag(FLAGS_prompt_min);
  o.prompt_max_tokens = absl::GetFlag(FLAGS_prompt_max);
  o.continuation_tokens = absl::GetFlag(FLAGS_continuation);
  o.chat_tasks_path = absl::GetFlag(FLAGS_chat_prompts);
  o.chat_fraction = absl::GetFlag(FLAGS_chat_fraction);
  o.batch = absl::GetFlag(FLAGS_distill_batch);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.max_minutes = absl::GetFlag(FLAGS_max_minutes);
  return OutcomeCode(RunDistill(o));
}

int RunDrafter() {
  DrafterTrainingOptions o;
  o.target_dir = absl::GetFlag(FLAGS_target);
  o.distill_path = absl::GetFlag(FLAGS_data);
  o.work_dir = absl::GetFlag(FLAGS_work_dir);
  o.out_dir = absl::GetFlag(FLAGS_out);
  if (!Require({{"target", o.target_dir},
                {"data", o.distill_path},
                {"work_dir", o.work_dir},
                {"out", o.out_dir}})) {
    return 2;
  }
  o.num_layers = absl::GetFlag(FLAGS_drafter_layers);
  o.intermediate_size = absl::GetFlag(FLAGS_drafter_intermediate);
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.target_layer_ids = IntList(absl::GetFlag(FLAGS_target_layer_ids));
  o.num_passes = absl::GetFlag(FLAGS_num_passes);
  o.gamma = absl::GetFlag(FLAGS_gamma);
  o.eta = absl::GetFlag(FLAGS_eta);
  o.proposal_mix = absl::GetFlag(FLAGS_proposal_mix);
  o.causal_editor = absl::GetFlag(FLAGS_causal_editor);
  o.edit_loss_weight = absl::GetFlag(FLAGS_edit_loss_weight);
  o.edit_selected_weight = absl::GetFlag(FLAGS_edit_selected_weight);
  o.edit_truth_share = absl::GetFlag(FLAGS_edit_truth_share);
  o.edit_truth_blocks = absl::GetFlag(FLAGS_edit_truth_blocks);
  o.sequences_per_step = absl::GetFlag(FLAGS_sequences_per_step);
  o.blocks_per_sequence = absl::GetFlag(FLAGS_blocks_per_sequence);
  o.train_windows = IntList(absl::GetFlag(FLAGS_train_windows));
  o.gt_selection_ratio = absl::GetFlag(FLAGS_gt_selection_ratio);
  o.round_anchor_share = absl::GetFlag(FLAGS_round_anchor_share);
  o.lookup_seed_ngram = absl::GetFlag(FLAGS_lookup_seed_ngram);
  o.seed_logit_bonus = absl::GetFlag(FLAGS_seed_logit_bonus);
  o.p1_only_steps = absl::GetFlag(FLAGS_p1_only_steps);
  o.plateau_delta = absl::GetFlag(FLAGS_plateau_delta);
  o.plateau_patience = absl::GetFlag(FLAGS_plateau_patience);
  o.heldout_path = absl::GetFlag(FLAGS_heldout_data);
  o.heldout_blocks_per_sequence = absl::GetFlag(FLAGS_heldout_blocks);
  o.init_from = absl::GetFlag(FLAGS_init_from);
  FillTrainingLoop(o);
  return OutcomeCode(RunDrafterTraining(o));
}

int RunEval() {
  EvaluationOptions o;
  o.target_dir = absl::GetFlag(FLAGS_target);
  o.drafter_dir = absl::GetFlag(FLAGS_drafter);
  o.work_dir = absl::GetFlag(FLAGS_work_dir);
  if (!Require({{"target", o.target_dir},
                {"drafter", o.drafter_dir},
                {"work_dir", o.work_dir}})) {
    return 2;
  }
  o.corpus = CorpusFromFlags();
  o.num_prompts = absl::GetFlag(FLAGS_num_prompts);
  o.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.window = absl::GetFlag(FLAGS_window);
  o.passes = IntList(absl::GetFlag(FLAGS_passes));
  o.causal_too = absl::GetFlag(FLAGS_causal_too);
  o.seed = absl::GetFlag(FLAGS_seed);
  const std::string split = absl::GetFlag(FLAGS_prompt_split);
  if (split != "heldout" && split != "train") {
    std::cerr << "dedit-train: --prompt_split must be heldout or train\n";
    return 2;
  }
  o.split = split == "train" ? CorpusSplit::kTrain : CorpusSplit::kHeldOut;
  auto report = RunEvaluation(o);
  if (!report.ok()) return Fail(report.status());
  const std::string path = absl::GetFlag(FLAGS_report);
  if (!path.empty()) {
    absl::Status status =
        dedit::WriteFileAtomically(path, report->dump(2) + "\n");
    if (!status.ok()) return Fail(status);
  }
  return 0;
}

// The editing headroom (training/headroom.h) as one JSON report.
int RunHeadroomCommand() {
  HeadroomOptions o;
  o.target_dir = absl::GetFlag(FLAGS_target);
  o.drafter_dir = absl::GetFlag(FLAGS_drafter);
  o.data_path = absl::GetFlag(FLAGS_data);
  if (!Require({{"target", o.target_dir},
                {"drafter", o.drafter_dir},
                {"data", o.data_path}})) {
    return 2;
  }
  o.tasks_path = absl::GetFlag(FLAGS_chat_prompts);
  o.window = absl::GetFlag(FLAGS_window);
  o.anchor_stride = absl::GetFlag(FLAGS_anchor_stride);
  o.max_instances = absl::GetFlag(FLAGS_max_instances);
  auto report = RunHeadroom(o);
  if (!report.ok()) return Fail(report.status());
  const std::string path = absl::GetFlag(FLAGS_report);
  if (!path.empty()) {
    absl::Status status =
        dedit::WriteFileAtomically(path, report->dump(1) + "\n");
    if (!status.ok()) return Fail(status);
  }
  return 0;
}

// Every pass's drafts and the neighbour oracle at every anchor of each
// record (DraftBlocks), one JSON line per record: {"anchors": [...],
// "passes": [[[slot...] per block] per pass], "oracle": [[slot...] per
// block]}.
int RunDraftsCommand() {
  const std::string target = absl::GetFlag(FLAGS_target);
  const std::string drafter = absl::GetFlag(FLAGS_drafter);
  const std::string data_path = absl::GetFlag(FLAGS_data);
  const std::string report = absl::GetFlag(FLAGS_report);
  if (!Require({{"target", target},
                {"drafter", drafter},
                {"data", data_path},
                {"report", report}})) {
    return 2;
  }
  const std::string mask_name = absl::GetFlag(FLAGS_edit_mask);
  EditMask mask;
  if (mask_name == "as_trained") {
    mask = EditMask::kAsTrained;
  } else if (mask_name == "causal") {
    mask = EditMask::kCausal;
  } else if (mask_name == "bidirectional") {
    mask = EditMask::kBidirectional;
  } else {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--edit_mask must be as_trained, causal or "
                     "bidirectional, got '",
                     mask_name, "'")));
  }
  auto records = ReadDistillData(data_path);
  if (!records.ok()) return Fail(records.status());
  std::vector<const DistillRecord*> chosen;
  const int limit = absl::GetFlag(FLAGS_max_instances);
  for (const DistillRecord& r : *records) {
    if (limit > 0 && static_cast<int>(chosen.size()) >= limit) break;
    chosen.push_back(&r);
  }
  auto drafts =
      DraftBlocks(target, drafter, chosen, absl::GetFlag(FLAGS_window),
                  absl::GetFlag(FLAGS_anchor_stride),
                  absl::GetFlag(FLAGS_draft_passes), mask);
  if (!drafts.ok()) return Fail(drafts.status());
  std::string out;
  for (const BlockDrafts& d : *drafts) {
    out +=
        nlohmann::json{
            {"anchors", d.anchors}, {"passes", d.passes}, {"oracle", d.oracle}}
            .dump() +
        "\n";
  }
  const absl::Status status = dedit::WriteFileAtomically(report, out);
  if (!status.ok()) return Fail(status);
  return 0;
}

int RunWiden() {
  WidenOptions o;
  o.from_dir = absl::GetFlag(FLAGS_from);
  o.out_dir = absl::GetFlag(FLAGS_out);
  o.factor = absl::GetFlag(FLAGS_factor);
  if (!Require({{"from", o.from_dir}, {"out", o.out_dir}})) return 2;
  auto summary = WidenCheckpoint(o);
  if (!summary.ok()) return Fail(summary.status());
  std::cout << (summary->kind == CheckpointKind::kTarget ? "target" : "drafter")
            << " widened x" << summary->factor << " into " << o.out_dir
            << ": hidden " << summary->hidden_size << ", "
            << summary->parameters << " parameters, " << summary->weight_bytes
            << " weight bytes"
            << (summary->exact ? "" : " (inexact: F is not a power of two)")
            << "\n";
  return 0;
}

// Greedy agreement of --wide against --target (training/greedy_agreement.h)
// on the prompts of a chat task jsonl, as one JSON report.
int RunWidenCheck() {
  const std::string target_dir = absl::GetFlag(FLAGS_target);
  const std::string wide_dir = absl::GetFlag(FLAGS_wide);
  const std::string prompts_path = absl::GetFlag(FLAGS_chat_prompts);
  if (!Require({{"target", target_dir},
                {"wide", wide_dir},
                {"chat_prompts", prompts_path}})) {
    return 2;
  }
  const absl::Status kernel = dedit::SetCpuProductsFlag(
      absl::GetFlag(FLAGS_check_products), "--check_products");
  if (kernel.code() == absl::StatusCode::kInvalidArgument) {
    std::cerr << "dedit-train: " << kernel.message() << "\n";
    return 2;
  }
  if (!kernel.ok()) return Fail(kernel);
  auto tokenizer = dedit::Tokenizer::FromFile(target_dir + "/tokenizer.json");
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  auto prompts = ChatTaskPrompts(prompts_path, **tokenizer);
  if (!prompts.ok()) return Fail(prompts.status());
  auto reference = dedit::Qwen3Model::Load(target_dir, {});
  if (!reference.ok()) return Fail(reference.status());
  auto wide = dedit::Qwen3Model::Load(wide_dir, {});
  if (!wide.ok()) return Fail(wide.status());
  auto report = MeasureGreedyAgreement(**reference, **wide, *prompts,
                                       absl::GetFlag(FLAGS_max_new_tokens));
  if (!report.ok()) return Fail(report.status());
  nlohmann::json j = report->ToJson();
  j["products"] = std::string(dedit::CpuProductsName(dedit::GetCpuProducts()));
  j["max_new_tokens"] = absl::GetFlag(FLAGS_max_new_tokens);
  const std::string text = j.dump(2) + "\n";
  std::cout << text;
  const std::string path = absl::GetFlag(FLAGS_report);
  if (!path.empty()) {
    absl::Status status = dedit::WriteFileAtomically(path, text);
    if (!status.ok()) return Fail(status);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "dedit-train "
      "<tokenizer|target|distill|drafter|eval|headroom|drafts|widen|"
      "widen-check> "
      "[--flags]");
  if (argc < 2 || argv[1][0] == '-') {
    std::cerr << "usage: dedit-train "
                 "<tokenizer|target|distill|drafter|eval|headroom|drafts|widen|"
                 "widen-check> "
                 "[--flags]   (--help for flags)\n";
    return 2;
  }
  const std::string command = argv[1];
  std::vector<char*> args = {argv[0]};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (absl::GetFlag(FLAGS_threads) > 0)
    dedit::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  if (command == "tokenizer") return RunTokenizer();
  if (command == "target") return RunTarget();
  if (command == "distill") return RunDistillStage();
  if (command == "drafter") return RunDrafter();
  if (command == "eval") return RunEval();
  if (command == "headroom") return RunHeadroomCommand();
  if (command == "drafts") return RunDraftsCommand();
  if (command == "widen") return RunWiden();
  if (command == "widen-check") return RunWidenCheck();
  std::cerr << "dedit-train: unknown command '" << command << "'\n";
  return 2;
}
