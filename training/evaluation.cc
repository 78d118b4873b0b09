#include "training/evaluation.h"

#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/model_config.h"
#include "common/base/status.h"
#include "common/engine/speculative_engine.h"
#include "common/model/in_process.h"
#include "common/tokenizer/tokenizer.h"
#include "training/progress.h"

namespace dedit::training {
namespace {

struct RunTotals {
  AcceptanceSummary summary;
  int64_t tokens = 0;
  double decode_seconds = 0;
  bool lossless = true;
};

// One request alone (batch size 1) through the engine.
absl::StatusOr<GenerationResult> RunOne(InProcessStack& stack,
                                        const std::vector<int32_t>& prompt,
                                        int max_new_tokens, int window,
                                        int passes) {
  GenerationRequest r;
  r.prompt = prompt;
  r.max_new_tokens = max_new_tokens;
  r.window = window;
  r.passes = passes;
  ASSIGN_OR_RETURN(std::vector<GenerationResult> results,
                   stack.engine().Generate({r}));
  if (!results[0].status.ok()) return results[0].status;
  return std::move(results[0]);
}

void Accumulate(const GenerationResult& g, RunTotals* totals) {
  for (const RoundRecord& round : g.rounds) totals->summary.Add(round);
  totals->tokens += static_cast<int64_t>(g.tokens.size());
  totals->decode_seconds += g.decode_seconds;
}

struct RunConfig {
  bool causal = false;
  int passes = 1;
};

nlohmann::json EditOutcomesJson(const AcceptanceSummary& s) {
  nlohmann::json passes = nlohmann::json::array();
  for (size_t k = 0; k < s.edit_outcomes.size(); ++k) {
    const auto& o = s.edit_outcomes[k];
    passes.push_back({{"pass", k + 1},
                      {"extended", o[0]},
                      {"unchanged", o[1]},
                      {"shortened", o[2]}});
  }
  return passes;
}

}  // namespace

absl::StatusOr<nlohmann::json> RunEvaluation(const EvaluationOptions& o) {
  ASSIGN_OR_RETURN(std::string tokenizer_json,
                   ReadFileToString(o.target_dir + "/tokenizer.json"));
  ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromJson(tokenizer_json));
  const std::optional<int32_t> eot = tokenizer->TokenToId("<|endoftext|>");
  if (!eot) return absl::InvalidArgumentError("tokenizer has no <|endoftext|>");
  RETURN_IF_ERROR(MakeDirs(o.work_dir));
  ASSIGN_OR_RETURN(std::vector<CorpusFile> files, ListCorpusFiles(o.corpus));
  const bool heldout_split = o.split == CorpusSplit::kHeldOut;
  ASSIGN_OR_RETURN(TokenStream heldout,
                   LoadOrBuildTokenStream(
                       files, o.split, *tokenizer, Fnv1a(tokenizer_json), *eot,
                       o.work_dir + (heldout_split ? "/tokens_heldout.bin"
                                                   : "/tokens_train.bin")));
  // Prompts: windows that contain no document boundary.
  std::vector<std::vector<int32_t>> prompts;
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int64_t> off_dist(
      0, static_cast<int64_t>(heldout.tokens.size()) - o.prompt_tokens - 1);
  for (int attempt = 0; attempt < 100 * o.num_prompts &&
                        static_cast<int>(prompts.size()) < o.num_prompts;
       ++attempt) {
    const int64_t off = off_dist(rng);
    std::vector<int32_t> p(heldout.tokens.begin() + off,
                           heldout.tokens.begin() + off + o.prompt_tokens);
    if (std::find(p.begin(), p.end(), *eot) == p.end())
      prompts.push_back(std::move(p));
  }

  nlohmann::json report;
  report["num_prompts"] = prompts.size();
  report["prompt_tokens"] = o.prompt_tokens;
  report["max_new_tokens"] = o.max_new_tokens;
  report["window"] = o.window;
  report["prompt_split"] = heldout_split ? "heldout" : "train";

  if (o.drafter_dir.empty())
    return absl::InvalidArgumentError("eval needs a drafter");
  InProcessStack::Options so;
  so.target_dir = o.target_dir;
  so.drafter_dir = o.drafter_dir;
  ASSIGN_OR_RETURN(auto stack, InProcessStack::Load(so));
  // Prompt-major order: each prompt runs target-only (W = 1, the baseline)
  // and then every drafter configuration back to back, so that load changes
  // on a shared machine hit all configurations alike.
  std::vector<RunConfig> configs;
  std::vector<bool> causal_modes = {false};
  if (o.causal_too) causal_modes.push_back(true);
  for (bool causal : causal_modes) {
    for (int k : o.passes) configs.push_back({causal, k});
  }
  RunTotals base;
  std::vector<RunTotals> totals(configs.size());
  std::vector<std::vector<int32_t>> reference;
  ProgressLine progress("eval", 0, static_cast<int64_t>(prompts.size()));
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSIGN_OR_RETURN(GenerationResult g,
                     RunOne(*stack, prompts[i], o.max_new_tokens, 1, 0));
    Accumulate(g, &base);
    reference.push_back(g.tokens);
    int64_t tokens = static_cast<int64_t>(g.tokens.size());
    for (size_t c = 0; c < configs.size(); ++c) {
      stack->drafter()->set_causal_editor(configs[c].causal);
      ASSIGN_OR_RETURN(GenerationResult d,
                       RunOne(*stack, prompts[i], o.max_new_tokens, o.window,
                              configs[c].passes));
      Accumulate(d, &totals[c]);
      if (d.tokens != reference[i]) totals[c].lossless = false;
      tokens += static_cast<int64_t>(d.tokens.size());
    }
    progress.Report(static_cast<int64_t>(i) + 1, tokens, "");
  }
  const double base_tps = base.tokens / std::max(base.decode_seconds, 1e-9);
  nlohmann::json samples = nlohmann::json::array();
  for (size_t i = 0; i < std::min<size_t>(3, prompts.size()); ++i) {
    ASSIGN_OR_RETURN(std::string prompt_text, tokenizer->Decode(prompts[i]));
    ASSIGN_OR_RETURN(std::string output_text, tokenizer->Decode(reference[i]));
    samples.push_back({{"prompt", prompt_text}, {"output", output_text}});
  }
  report["samples"] = samples;
  report["baseline"] = {{"tokens", base.tokens},
                        {"decode_seconds", base.decode_seconds},
                        {"tokens_per_s", base_tps}};
  std::cerr << absl::StrFormat("[eval] target-only: %d tokens, %.1f tok/s\n",
                               base.tokens, base_tps);
  std::cerr << "[eval] editor        K  tau    tok/s  speedup  lossless  "
               "edits (ext/unch/short per pass)\n";
  nlohmann::json runs = nlohmann::json::array();
  for (size_t c = 0; c < configs.size(); ++c) {
    const RunTotals& t = totals[c];
    const bool causal = configs[c].causal;
    const int k = configs[c].passes;
    const double tps = t.tokens / std::max(t.decode_seconds, 1e-9);
    nlohmann::json run = {{"editor", causal ? "causal" : "bidirectional"},
                          {"passes", k},
                          {"tau", t.summary.mean_acceptance_length()},
                          {"drafted_rounds", t.summary.drafted_rounds},
                          {"tokens", t.tokens},
                          {"tokens_per_s", tps},
                          {"speedup", tps / std::max(base_tps, 1e-9)},
                          {"lossless", t.lossless},
                          {"edit_outcomes", EditOutcomesJson(t.summary)}};
    std::string edits;
    for (const auto& e : run["edit_outcomes"]) {
      absl::StrAppend(&edits, " P", e["pass"].get<int>(), ":",
                      e["extended"].get<int64_t>(), "/",
                      e["unchanged"].get<int64_t>(), "/",
                      e["shortened"].get<int64_t>());
    }
    std::cerr << absl::StrFormat(
        "[eval] %-13s %d  %.3f  %6.1f  %.2fx    %s   %s\n",
        causal ? "causal" : "bidirectional", k, run["tau"].get<double>(), tps,
        run["speedup"].get<double>(), t.lossless ? "yes" : "NO", edits);
    runs.push_back(std::move(run));
  }
  report["runs"] = runs;
  return report;
}

}  // namespace dedit::training
