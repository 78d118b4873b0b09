// `dedit-train distill`: target-aligned training data for the drafter. As
// DFlash and DEdit train on the target's own responses, this takes prompts
// from the train split of the corpus (and of the chat task suite, when one
// is given) and records the target's greedy continuations (the engine,
// target-only, batched), which are exactly what the drafter will be asked to
// predict at T = 0.
//
// Output: a binary file of records, appended batch by batch, so an
// interrupted run continues where it stopped (record i's prompt is a pure
// function of (seed, i)).
//
//   DistillOptions o;  // target_dir, corpus, out_path, ...
//   ASSIGN_OR_RETURN(StageOutcome outcome, RunDistill(o));
//   ASSIGN_OR_RETURN(std::vector<DistillRecord> data, ReadDistillData(path));
//   ASSIGN_OR_RETURN(data, ReadDistillFiles("a.bin,b.bin"));
#ifndef DEDIT_TRAINING_DISTILL_H_
#define DEDIT_TRAINING_DISTILL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "training/corpus.h"
#include "training/progress.h"

namespace dedit::training {

struct DistillOptions {
  std::string target_dir;  // exported target with tokenizer.json
  CorpusSpec corpus;
  std::string work_dir;  // token cache (shared with the target stage)
  std::string out_path;
  int num_sequences = 2048;
  int prompt_min_tokens = 16;
  int prompt_max_tokens = 96;
  int continuation_tokens = 160;
  int batch = 32;  // sequences decoded together
  uint64_t seed = 2;
  double max_minutes = 0;
  // Chat task prompts (a training/chat_tasks.py jsonl). When set, a
  // `chat_fraction` share of the records (chosen by (seed, i)) prompt with
  // a random instance's conversation up to the assistant turn, and the
  // target answers it greedily up to its EOS (<|im_end|> for a chat target)
  // or continuation_tokens; the rest are corpus windows as before.
  std::string chat_tasks_path;
  double chat_fraction = 0.5;
};

struct DistillRecord {
  int32_t prompt_len = 0;
  std::vector<int32_t> tokens;  // prompt followed by the continuation
};

absl::StatusOr<StageOutcome> RunDistill(const DistillOptions& options);

// Reads every complete record (a torn last record is ignored).
absl::StatusOr<std::vector<DistillRecord>> ReadDistillData(
    const std::string& path);

// The records of a comma-separated list of distillation files, in the
// order named (e.g. the target's answers to the task suite, then more of
// one kind of prompt): each is read as ReadDistillData reads it. An empty
// name, or a missing file, is an error naming it.
absl::StatusOr<std::vector<DistillRecord>> ReadDistillFiles(
    const std::string& paths);

}  // namespace dedit::training

#endif  // DEDIT_TRAINING_DISTILL_H_
