// `dedit-train target`: pretrains a small Qwen3 model on the corpus with
// next-token cross-entropy and exports it as an HF folder (config.json,
// model.safetensors, tokenizer.json).
//
// Each step takes `batch_size` windows of seq_len + 1 tokens at offsets
// drawn from (seed, step) in the train split (of the corpus, and of the
// chat task suite when one is given). The state (weights, AdamW
// moments, step) is saved to <work_dir>/state.safetensors every
// checkpoint_every_s seconds and when the time budget ends; running the same
// command again resumes there, bit for bit.
//
//   TargetTrainingOptions o;  // fill paths and model shape
//   ASSIGN_OR_RETURN(StageOutcome outcome, RunTargetTraining(o));
#ifndef DEDIT_TRAINING_TARGET_TRAINER_H_
#define DEDIT_TRAINING_TARGET_TRAINER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/model_config.h"
#include "training/corpus.h"
#include "training/optimizer.h"
#include "training/progress.h"

namespace dedit::training {

struct TargetTrainingOptions {
  std::string tokenizer_path;  // tokenizer.json from `dedit-train tokenizer`
  CorpusSpec corpus;
  std::string work_dir;  // token caches, state, log.jsonl
  std::string out_dir;   // the exported model
  // vocab_size, bos/eos and max_position_embeddings are filled in from the
  // tokenizer and seq_len.
  Qwen3Config model;
  int seq_len = 256;
  int max_positions = 0;  // exported context; 0 or < seq_len → seq_len
  int batch_size = 16;
  int64_t steps = 2000;
  LearningRateSchedule schedule;
  AdamWOptions adamw;
  uint64_t seed = 1;
  double checkpoint_every_s = 300;
  double max_minutes = 0;  // 0 = until `steps`
  int eval_every = 250;    // held-out loss every this many steps
  int eval_windows = 32;
  std::string export_dtype = "bfloat16";
  // The chat task suite (training/chat_tasks.py generate): a folder with
  // train.jsonl and heldout.jsonl. When set, `chat_fraction` of every
  // batch's windows come from the tasks, the rest from the corpus; held-out
  // loss is reported for both; and <|im_end|> joins the exported model's
  // EOS ids (it ends an assistant turn).
  std::string chat_tasks_dir;
  double chat_fraction = 0.5;
  // An exported target (dedit-train target's output folder) to start from:
  // its weights, with a fresh optimizer and schedule, to train a shipped
  // model further. Its shape must be `model`'s, except that it may have
  // fewer layers: it is then grown (TrainableTarget::Grow) to
  // model.num_hidden_layers, computing the same function at step 0.
  // Empty = fresh weights.
  std::string init_from;
  // > 0: the state in work_dir was saved by this run with `steps` equal to
  // this; resume it on a schedule of `steps` instead (e.g. to finish a run
  // sooner: the cosine decay then continues from the saved step on the
  // shorter schedule). Every other setting must match.
  int64_t reschedule_from_steps = 0;
};

absl::StatusOr<StageOutcome> RunTargetTraining(
    const TargetTrainingOptions& options);

}  // namespace dedit::training

#endif  // DEDIT_TRAINING_TARGET_TRAINER_H_
