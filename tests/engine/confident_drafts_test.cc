// SpeculationOptions::min_draft_confidence and verify_chunk over a
// scripted target (torch-free): drafts are cut before their first
// unconfident slot, a draft cut to nothing makes a decode step and backs
// the drafter off, a chunked draft is verified a few rows per round, and
// the output is the target's whatever the drafter says or claims.
#include <cstdint>
#include <utility>
#include <vector>

#include "common/engine/speculative_engine.h"
#include "gtest/gtest.h"
#include "tests/engine/scripted_target.h"

namespace dedit {
namespace {

constexpr int64_t kPromptLength = 4;

// Drafts the target's answer at answer positions `known` covers and a
// wrong token elsewhere; each slot's confidence is `sure` where it is
// right and `unsure` where it is wrong. Counts its calls.
class ScriptedDrafter : public Drafter {
 public:
  ScriptedDrafter(const ScriptedTarget* target, std::vector<bool> known,
                  float sure, float unsure)
      : target_(target),
        known_(std::move(known)),
        sure_(sure),
        unsure_(unsure) {}
  absl::StatusOr<std::vector<DraftResult>> Draft(
      const std::vector<DraftRequest>& requests) override {
    std::vector<DraftResult> out;
    for (const DraftRequest& r : requests) {
      ++calls;
      DraftPass pass;
      for (int j = 1; j < r.window; ++j) {
        const int64_t i = r.start - kPromptLength + j;
        const bool right = i < static_cast<int64_t>(known_.size()) && known_[i];
        pass.tokens.push_back(right ? target_->At(i) : target_->At(i) + 1);
        pass.confidences.push_back(right ? sure_ : unsure_);
      }
      out.push_back({std::vector<DraftPass>(r.passes, pass)});
    }
    return out;
  }
  absl::Status Release(SequenceId) override { return absl::OkStatus(); }
  int block_size() const override { return 16; }

  int calls = 0;

 private:
  const ScriptedTarget* target_;
  std::vector<bool> known_;
  float sure_, unsure_;
};

struct Outcome {
  GenerationResult result;
  int draft_calls = 0;
};

Outcome Generate(const std::vector<int32_t>& answer,
                 const std::vector<bool>& known, float sure, float unsure,
                 double min_confidence,
                 DraftMethod method = DraftMethod::kModel,
                 int verify_chunk = 0) {
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  ScriptedTarget target(kPromptLength, answer);
  ScriptedDrafter drafter(&target, known, sure, unsure);
  SpeculativeEngine::Options o;
  o.speculation.min_draft_confidence = min_confidence;
  o.speculation.verify_chunk = verify_chunk;
  SpeculativeEngine engine(&target, &drafter, o);
  GenerationRequest r;
  r.prompt = prompt;
  r.max_new_tokens = static_cast<int>(answer.size());
  r.window = 8;
  r.method = method;
  r.ignore_eos = true;
  auto results = engine.Generate({r});
  EXPECT_TRUE(results.ok()) << results.status();
  Outcome out;
  if (!results.ok()) return out;
  out.result = (*results)[0];
  out.draft_calls = drafter.calls;
  EXPECT_EQ(out.result.tokens, answer) << "min confidence " << min_confidence;
  return out;
}

std::vector<int32_t> Answer(int n) {
  std::vector<int32_t> a;
  for (int i = 0; i < n; ++i) a.push_back(100 + i);
  return a;
}

TEST(ConfidentDraftsTest, CutsBeforeTheFirstUnconfidentSlot) {
  // The drafter knows every answer token but says so only for some: a
  // draft is verified up to its first slot under the threshold.
  // 41 tokens: the prefill's, then five rounds of W = 8.
  const std::vector<int32_t> answer = Answer(41);
  std::vector<bool> known(answer.size(), true);
  // All sure: whole windows of 7 drafts.
  Outcome whole = Generate(answer, known, 0.9f, 0.9f, 0.5);
  const AcceptanceSummary all = Summarize(whole.result.rounds);
  EXPECT_EQ(all.cut_rounds, 0);
  EXPECT_DOUBLE_EQ(all.mean_acceptance_length(), 8.0);
  // Right but unsure everywhere: every draft is cut to nothing.
  Outcome none = Generate(answer, known, 0.2f, 0.2f, 0.5);
  const AcceptanceSummary cut = Summarize(none.result.rounds);
  EXPECT_EQ(cut.drafted_rounds, 0);
  EXPECT_GE(cut.cut_rounds, 1);
  EXPECT_EQ(cut.rounds, 40);
  for (size_t i = 0; i < none.result.rounds.size(); ++i) {
    const RoundRecord& r = none.result.rounds[i];
    EXPECT_EQ(r.window, 1);
    // Each round asked the drafter and cut its draft, or skipped it; the
    // last, with one token left to make, has nothing to draft.
    if (i + 1 < none.result.rounds.size()) EXPECT_NE(r.cut, r.skipped) << i;
  }
  // Off (0): nothing is cut, whatever the confidences.
  Outcome off = Generate(answer, known, 0.2f, 0.2f, 0);
  EXPECT_EQ(Summarize(off.result.rounds).cut_rounds, 0);
  EXPECT_DOUBLE_EQ(Summarize(off.result.rounds).mean_acceptance_length(), 8.0);
}

TEST(ConfidentDraftsTest, PartialCutsKeepTheConfidentPrefix) {
  // Right (and sure) on even answer positions only, unsure and wrong on
  // odd ones: every kept draft ends before its first odd position.
  const std::vector<int32_t> answer = Answer(30);
  std::vector<bool> known(answer.size());
  for (size_t i = 0; i < known.size(); i += 2) known[i] = true;
  Outcome out = Generate(answer, known, 0.9f, 0.1f, 0.5);
  for (const RoundRecord& r : out.result.rounds) {
    EXPECT_LE(r.window, 2);  // at most one confident slot in a row
    if (r.window == 2) EXPECT_EQ(r.accepted, 1);  // and it was right
  }
  EXPECT_GT(Summarize(out.result.rounds).drafted_rounds, 0);
}

TEST(ConfidentDraftsTest, BacksOffTheDrafterWhileItCannotGuess) {
  // Never right, never sure: after each draft cut to nothing the drafter
  // is skipped for 1, 2, 4, 8, 8, ... rounds.
  const std::vector<int32_t> answer = Answer(60);
  const std::vector<bool> known(answer.size(), false);
  Outcome out = Generate(answer, known, 0.9f, 0.1f, 0.5);
  const AcceptanceSummary s = Summarize(out.result.rounds);
  // One token per round, rounds 0..58; the drafter is asked at 0, 2, 5,
  // 10, 19, 28, 37, 46 and 55, and skipped in between (round 58 has one
  // token left to make: nothing to draft).
  EXPECT_EQ(s.rounds, 59);
  EXPECT_EQ(out.draft_calls, 9);
  EXPECT_EQ(s.cut_rounds, 9);
  EXPECT_EQ(s.skipped_rounds, 49);
  // Without the threshold the drafter is asked every round that drafts.
  Outcome off = Generate(answer, known, 0.9f, 0.1f, 0);
  EXPECT_EQ(off.draft_calls, 58);
}

TEST(ConfidentDraftsTest, AConfidentDraftEndsTheBackOff) {
  // Unknown for the first 20 answer tokens, then known and sure: drafts
  // come back at the next probe, and whole windows are accepted again.
  const std::vector<int32_t> answer = Answer(80);
  std::vector<bool> known(answer.size(), false);
  for (size_t i = 20; i < known.size(); ++i) known[i] = true;
  Outcome out = Generate(answer, known, 0.9f, 0.1f, 0.5);
  int whole = 0;
  for (const RoundRecord& r : out.result.rounds) whole += r.window == 8;
  EXPECT_GE(whole, 5);
  EXPECT_FALSE(out.result.rounds.back().skipped);
}

TEST(ConfidentDraftsTest, HybridCutsOnlyTheModelsRounds) {
  // A prompt lookup round is never cut: its confidences are 1.
  const std::vector<int32_t> answer = {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4};
  const std::vector<bool> known(answer.size(), false);
  Outcome out = Generate(answer, known, 0.9f, 0.1f, 0.5, DraftMethod::kHybrid);
  const AcceptanceSummary s = Summarize(out.result.rounds);
  EXPECT_GT(s.lookup_rounds, 0);
  for (const RoundRecord& r : out.result.rounds) {
    if (r.looked_up) EXPECT_FALSE(r.cut);
  }
}

TEST(ConfidentDraftsTest, ChunksVerifyTheConfidentPrefixOnly) {
  // Right and sure on 5 answer positions of every 6, unsure and wrong on
  // the 6th: the cut keeps up to 5 tokens, verified 2 drafts per round,
  // and a reused rest never holds a cut slot.
  const std::vector<int32_t> answer = Answer(60);
  std::vector<bool> known(answer.size(), true);
  for (size_t i = 5; i < known.size(); i += 6) known[i] = false;
  Outcome whole = Generate(answer, known, 0.9f, 0.1f, 0.5);
  Outcome chunked =
      Generate(answer, known, 0.9f, 0.1f, 0.5, DraftMethod::kModel, 3);
  EXPECT_EQ(chunked.draft_calls, whole.draft_calls);
  const AcceptanceSummary s = Summarize(chunked.result.rounds);
  EXPECT_GT(s.reused_rounds, 0);
  for (const RoundRecord& r : chunked.result.rounds) {
    EXPECT_LE(r.window, 3);
    // Every verified draft token was confident, so right: all accepted.
    EXPECT_EQ(r.accepted, r.window - 1);
    if (r.reused) EXPECT_FALSE(r.cut);
  }
  EXPECT_EQ(Summarize(whole.result.rounds).rounds + s.reused_rounds, s.rounds);
}

}  // namespace
}  // namespace dedit
