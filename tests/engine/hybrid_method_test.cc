// The hybrid method's choice between prompt lookup and the model drafter,
// over a scripted target (torch-free): whatever the choice, the output is
// the target's; shorter lookups join in only for a sequence whose model
// drafts stopped paying.
#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "common/engine/speculative_engine.h"
#include "gtest/gtest.h"
#include "tests/engine/scripted_target.h"

namespace dedit {
namespace {

// Proposes the target's answer (right) or that plus one (wrong).
class ScriptedModelDrafter : public Drafter {
 public:
  ScriptedModelDrafter(const ScriptedTarget* target, int64_t prompt_length,
                       bool right)
      : target_(target), prompt_length_(prompt_length), right_(right) {}
  absl::StatusOr<std::vector<DraftResult>> Draft(
      const std::vector<DraftRequest>& requests) override {
    std::vector<DraftResult> out;
    for (const DraftRequest& r : requests) {
      DraftPass pass;
      for (int j = 1; j < r.window; ++j) {
        const int32_t t = target_->At(r.start - prompt_length_ + j);
        pass.tokens.push_back(right_ ? t : t + 1);
      }
      pass.confidences.assign(pass.tokens.size(), 1.0f);
      out.push_back({std::vector<DraftPass>(r.passes, pass)});
    }
    return out;
  }
  absl::Status Release(SequenceId) override { return absl::OkStatus(); }
  int block_size() const override { return 16; }

 private:
  const ScriptedTarget* target_;
  int64_t prompt_length_;
  bool right_;
};

class HybridMethodTest : public ::testing::Test {
 protected:
  // The prompt: 20 distinct tokens. The answer copies runs of it, each
  // after a token the prompt does not have, so that each run starts with
  // a one-token match (the run's first token) and no longer one.
  void SetUp() override {
    for (int32_t t = 10; t < 30; ++t) prompt_.push_back(t);
    int fresh = 200;
    for (int start : {5, 12, 2, 9, 15, 1, 7}) {
      for (int i = 0; i < 5; ++i) answer_.push_back(prompt_[start + i]);
      answer_.push_back(fresh++);
    }
  }

  GenerationResult Run(bool drafter_right, double short_match_below) {
    ScriptedTarget target(static_cast<int64_t>(prompt_.size()), answer_);
    ScriptedModelDrafter drafter(&target, static_cast<int64_t>(prompt_.size()),
                                 drafter_right);
    SpeculativeEngine::Options o;
    o.speculation.hybrid_short_match_below = short_match_below;
    SpeculativeEngine engine(&target, &drafter, o);
    GenerationRequest r;
    r.prompt = prompt_;
    r.max_new_tokens = static_cast<int>(answer_.size());
    r.window = 8;
    r.method = DraftMethod::kHybrid;
    r.ignore_eos = true;
    auto results = engine.Generate({r});
    EXPECT_TRUE(results.ok()) << results.status();
    if (!results.ok()) return GenerationResult();
    EXPECT_EQ((*results)[0].tokens, answer_) << "below " << short_match_below;
    return (*results)[0];
  }

  std::vector<int32_t> prompt_, answer_;
};

TEST_F(HybridMethodTest, ShortMatchesTakeOverFromAModelThatDoesNotPay) {
  const AcceptanceSummary off = Summarize(Run(false, 0).rounds);
  const AcceptanceSummary on = Summarize(Run(false, 0.5).rounds);
  // Without short matches every run starts with model rounds that accept
  // nothing; with them the lookup proposes the run from its first token.
  EXPECT_GT(on.lookup_rounds, off.lookup_rounds);
  EXPECT_LT(on.rounds, off.rounds);
  EXPECT_GT(on.accepted_tokens, off.accepted_tokens);
}

TEST_F(HybridMethodTest, ShortMatchesStayAwayFromAModelThatPays) {
  const GenerationResult off = Run(true, 0);
  const GenerationResult on = Run(true, 0.5);
  ASSERT_EQ(on.rounds.size(), off.rounds.size());
  for (size_t i = 0; i < on.rounds.size(); ++i) {
    EXPECT_EQ(on.rounds[i].looked_up, off.rounds[i].looked_up) << i;
    EXPECT_EQ(on.rounds[i].accepted, off.rounds[i].accepted) << i;
  }
}

}  // namespace
}  // namespace dedit
