// `dedit-train eval`: what the trained pair does in the real engine on
// held-out prompts (the DEdit paper's evaluation protocol, in miniature).
//
// Prompts are windows of the held-out split (files never seen in training).
// Each request runs alone (batch size 1) at T = 0: target-only (W = 1, the
// baseline), then with the drafter for every pass count K in `passes`,
// bidirectional and (optionally) with the causal editor at the same
// weights — prompt by prompt, all configurations back to back, so that load
// drift on a shared machine affects them alike. Reported per configuration: tau
// (mean acceptance length, bonus included), decode tokens/s, speedup over the
// baseline, per-pass edit outcomes (extended / unchanged / shortened), and
// whether the output matched the target-only tokens (losslessness).
//
//   EvaluationOptions o;  // target_dir, drafter_dir, corpus, ...
//   ASSIGN_OR_RETURN(nlohmann::json report, RunEvaluation(o));
#ifndef DEDIT_TRAINING_EVALUATION_H_
#define DEDIT_TRAINING_EVALUATION_H_

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "training/corpus.h"

namespace dedit::training {

struct EvaluationOptions {
  std::string target_dir;
  std::string drafter_dir;
  CorpusSpec corpus;
  std::string work_dir;  // token cache
  int num_prompts = 16;
  int prompt_tokens = 64;
  int max_new_tokens = 128;
  int window = 16;
  std::vector<int> passes = {1, 2, 3, 4};
  bool causal_too = true;
  uint64_t seed = 4;
  // kHeldOut for the reported numbers; kTrain only to diagnose the gap
  // between training-distribution and held-out prompts.
  CorpusSplit split = CorpusSplit::kHeldOut;
};

// Returns the report (also printed as a table to stderr).
absl::StatusOr<nlohmann::json> RunEvaluation(const EvaluationOptions& options);

}  // namespace dedit::training

#endif  // DEDIT_TRAINING_EVALUATION_H_
