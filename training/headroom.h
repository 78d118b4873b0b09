// `dedit-train headroom`: the room edit passes have on held-out answers
// (docs/RESULTS.md, "Editing headroom"), evaluation only.
//
// Reads distilled answers (`dedit-train distill`), assigns each to the chat
// task instance whose prompt it answers (the distill stage draws instances
// at random, with repeats, so a record's index says nothing), scores each
// distinct instance's answer once with MeasureHeadroom (drafter_trainer.h:
// per slot P1, P2, the left and the full neighbour oracle, and the
// attention mass on the block's keys) and reports per task family and over
// all of them, per slot and as the mean over slots.
//
//   HeadroomOptions o;  // target_dir, drafter_dir, data_path, tasks_path
//   ASSIGN_OR_RETURN(nlohmann::json report, RunHeadroom(o));
#ifndef DEDIT_TRAINING_HEADROOM_H_
#define DEDIT_TRAINING_HEADROOM_H_

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"

namespace dedit::training {

struct HeadroomOptions {
  std::string target_dir;
  std::string drafter_dir;
  std::string data_path;  // distilled answers, e.g. distill-heldout.bin
  // The chat task jsonl (training/chat_tasks.py) whose prompts the answers
  // follow; every record must match one of its instances. Empty: every
  // distinct record counts, in one family "all".
  std::string tasks_path;
  int window = 16;
  int anchor_stride = 1;  // blocks anchored at every Nth answer position
  int max_instances = 0;  // 0 = all (the first distinct ones otherwise)
};

// The report: {"window", "drafter", ..., "families": {name: summary},
// "all": summary}; a summary holds "instances", "slots" (the scored slots),
// "mean_over_slots" and "pooled" (rates over every scored slot) of p1, p2,
// left_oracle, full_oracle and the block shares (p1_, p2_,
// uniform_block_share), and "per_slot": {"n": counts, each rate: a list},
// index k-1 for slot k.
absl::StatusOr<nlohmann::json> RunHeadroom(const HeadroomOptions& o);

}  // namespace dedit::training

#endif  // DEDIT_TRAINING_HEADROOM_H_
