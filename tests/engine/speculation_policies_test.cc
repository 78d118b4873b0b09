// The speculation policies one at a time (common/engine/
// speculation_policies.h), without an engine: each object's decisions and
// state across rounds. The engine composing them is tested in
// speculative_engine_test.cc, confident_drafts_test.cc and
// hybrid_method_test.cc, where output must stay the target's.
#include "common/engine/speculation_policies.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/engine/generation_request.h"
#include "common/engine/speculation_options.h"

namespace dedit {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

DraftResult OnePass(std::vector<int32_t> tokens, std::vector<float> conf) {
  DraftResult d;
  d.passes.push_back({std::move(tokens), std::move(conf)});
  return d;
}

TEST(BatchPauseTest, PausesOnlyRoundsLargerThanTheLimit) {
  EXPECT_FALSE(BatchPause(0).Pauses(1000));  // 0 = no limit
  EXPECT_FALSE(BatchPause(4).Pauses(4));
  EXPECT_TRUE(BatchPause(4).Pauses(5));
}

TEST(HybridLookupTest, LongMatchesAlwaysShortOnesOnlyOnceTheModelFails) {
  const NgramDrafter long_matches({3, 4, 16});
  const NgramDrafter any_match({1, 4, 16});
  HybridLookup hybrid(&long_matches, &any_match, 0.5);
  // "7 8 9" recurs: a long match.
  EXPECT_THAT(hybrid.Propose({7, 8, 9, 5, 7, 8, 9}, 2), ElementsAre(5, 7));
  // Only "9" recurs: too short while the model's rounds pay (or before any).
  const std::vector<int32_t> short_only = {9, 5, 1, 2, 9};
  EXPECT_THAT(hybrid.Propose(short_only, 2), IsEmpty());
  hybrid.RecordModelRound(3);
  EXPECT_THAT(hybrid.Propose(short_only, 2), IsEmpty());
  // Model rounds accepting nothing pull the moving mean under 0.5.
  for (int i = 0; i < 30; ++i) hybrid.RecordModelRound(0);
  EXPECT_THAT(hybrid.Propose(short_only, 2), ElementsAre(5, 1));
}

TEST(ConfidenceCutTest, CutsBeforeTheFirstDoubtfulSlot) {
  ConfidenceCut cut(0.5);
  DraftResult d = OnePass({1, 2, 3, 4}, {0.9f, 0.8f, 0.4f, 0.9f});
  EXPECT_EQ(cut.Apply(&d), ConfidenceCut::Cut::kShortened);
  EXPECT_THAT(d.passes.back().tokens, ElementsAre(1, 2));
  EXPECT_THAT(d.passes.back().confidences, ElementsAre(0.9f, 0.8f));
  // Slots without a confidence count as confident.
  DraftResult bare = OnePass({1, 2}, {});
  EXPECT_EQ(cut.Apply(&bare), ConfidenceCut::Cut::kWhole);
  EXPECT_FALSE(cut.SkipsRound());
}

TEST(ConfidenceCutTest, OffKeepsEveryDraftWhole) {
  ConfidenceCut off(0);
  DraftResult d = OnePass({1, 2}, {0.01f, 0.01f});
  EXPECT_EQ(off.Apply(&d), ConfidenceCut::Cut::kWhole);
  EXPECT_THAT(d.passes.back().tokens, ElementsAre(1, 2));
}

TEST(ConfidenceCutTest, EmptyDraftsBackOffDoublingUpToEightRounds) {
  ConfidenceCut cut(0.5);
  auto skipped_after_empty = [&cut] {
    DraftResult d = OnePass({1}, {0.1f});
    EXPECT_EQ(cut.Apply(&d), ConfidenceCut::Cut::kEmpty);
    int skipped = 0;
    while (cut.SkipsRound()) ++skipped;
    return skipped;
  };
  EXPECT_EQ(skipped_after_empty(), 1);
  EXPECT_EQ(skipped_after_empty(), 2);
  EXPECT_EQ(skipped_after_empty(), 4);
  EXPECT_EQ(skipped_after_empty(), 8);
  EXPECT_EQ(skipped_after_empty(), 8);
  // A draft that keeps a slot resets the back-off.
  DraftResult kept = OnePass({1, 2}, {0.9f, 0.1f});
  EXPECT_EQ(cut.Apply(&kept), ConfidenceCut::Cut::kShortened);
  EXPECT_EQ(skipped_after_empty(), 1);
}

TEST(AdaptiveSpeculationTest, DisabledAlwaysDrafts) {
  AdaptiveSpeculation off(false);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(off.Drafts());
}

TEST(AdaptiveSpeculationTest, MeasuresPlainFirstThenPausesWhileDraftsLose) {
  AdaptiveSpeculation a(true);
  EXPECT_FALSE(a.Drafts());  // a plain round first, to measure it
  a.RecordPlain(1.0);
  EXPECT_TRUE(a.Drafts());  // then a drafted one
  // Drafted rounds: 1 token in 2 s, slower than 1 token per plain second.
  a.RecordDrafted(1, 2.0);
  // Pauses of 1, 2, 4 ... plain rounds, each followed by one probe.
  std::vector<int> pauses;
  for (int probe = 0; probe < 6; ++probe) {
    int plain = 0;
    while (!a.Drafts()) {
      ++plain;
      a.RecordPlain(1.0);
    }
    a.RecordDrafted(1, 2.0);
    pauses.push_back(plain);
  }
  EXPECT_THAT(pauses, ElementsAre(1, 2, 4, 8, 16, 16));
}

TEST(AdaptiveSpeculationTest, KeepsDraftingWhileDraftsPay) {
  AdaptiveSpeculation a(true);
  EXPECT_FALSE(a.Drafts());
  a.RecordPlain(1.0);
  for (int i = 0; i < 10; ++i) {
    EXPECT_TRUE(a.Drafts()) << i;
    a.RecordDrafted(4, 1.5);  // 4 tokens in 1.5 s beats 1 per second
  }
}

TEST(ChunkedVerifyTest, VerifiesAChunkAndHoldsTheRestWhenAccepted) {
  ChunkedVerify chunked(3);  // bonus + 2 drafted tokens per round
  EXPECT_EQ(chunked.Verified({10, 11, 12, 13, 14}), 2u);
  // The chunk was accepted and the target's next token is the draft's.
  chunked.AfterVerify(true, 12);
  EXPECT_THAT(chunked.TakeHeld(), ElementsAre(13, 14));
  EXPECT_THAT(chunked.TakeHeld(), IsEmpty());  // taken once
}

TEST(ChunkedVerifyTest, DropsTheRestOnARejectionOrAnotherNextToken) {
  ChunkedVerify chunked(3);
  EXPECT_EQ(chunked.Verified({10, 11, 12, 13}), 2u);
  chunked.AfterVerify(false, 12);
  EXPECT_THAT(chunked.TakeHeld(), IsEmpty());
  EXPECT_EQ(chunked.Verified({10, 11, 12, 13}), 2u);
  chunked.AfterVerify(true, 99);
  EXPECT_THAT(chunked.TakeHeld(), IsEmpty());
}

TEST(ChunkedVerifyTest, ShortDraftsAndOffVerifyWhole) {
  EXPECT_EQ(ChunkedVerify(3).Verified({1, 2}), 2u);
  EXPECT_EQ(ChunkedVerify(0).Verified({1, 2, 3, 4, 5}), 5u);
}

TEST(SpeculationOptionsTest, ValidationNamesTheFlag) {
  EXPECT_TRUE(ValidateSpeculationOptions({}).ok());
  SpeculationOptions o;
  o.min_draft_confidence = 1.5;
  EXPECT_THAT(ValidateSpeculationOptions(o).message(),
              HasSubstr("--min_draft_confidence"));
  o = {};
  o.verify_chunk = 1;
  EXPECT_THAT(ValidateSpeculationOptions(o).message(),
              HasSubstr("--verify_chunk"));
  o = {};
  o.max_speculative_batch = -1;
  EXPECT_THAT(ValidateSpeculationOptions(o).message(),
              HasSubstr("--max_speculative_batch"));
  o = {};
  o.hybrid_min_ngram = 0;
  EXPECT_THAT(ValidateSpeculationOptions(o).message(),
              HasSubstr("--hybrid_min_ngram"));
  o = {};
  o.ngram.min_ngram = 3;
  o.ngram.max_ngram = 2;
  EXPECT_THAT(ValidateSpeculationOptions(o).message(), HasSubstr("n-gram"));
}

// One rule, one message, whoever calls it (the engine and the router).
TEST(ValidateRequestTest, NamesTheWireFieldThatIsWrong) {
  RequestRules rules;
  rules.vocab_size = 100;
  rules.max_context = 64;
  rules.max_new_tokens_limit = 32;
  rules.max_passes = 4;
  rules.drafter_block_size = 16;
  rules.ngram_max_window = 8;
  auto message = [&](auto edit) {
    GenerationRequest r;
    r.prompt = {1, 2, 3};
    r.max_new_tokens = 8;
    r.window = 8;
    r.passes = 1;
    edit(r);
    return std::string(ValidateRequest(r, rules).message());
  };
  EXPECT_EQ(message([](GenerationRequest&) {}), "");
  EXPECT_EQ(message([](GenerationRequest& r) { r.prompt.clear(); }),
            "prompt is empty");
  EXPECT_EQ(message([](GenerationRequest& r) { r.prompt[1] = 100; }),
            "prompt token_ids[1] = 100 is outside the vocabulary [0, 100)");
  EXPECT_THAT(message([](GenerationRequest& r) { r.prompt.assign(64, 1); }),
              HasSubstr("exceeds the context limit: at most 63 tokens"));
  EXPECT_THAT(message([](GenerationRequest& r) { r.max_new_tokens = 33; }),
              HasSubstr("max_tokens must be in [1, 32], got 33"));
  EXPECT_THAT(
      message([](GenerationRequest& r) { r.sampling.temperature = -1; }),
      HasSubstr("sampling.temperature"));
  EXPECT_THAT(message([](GenerationRequest& r) {
                r.stop_token_ids = {5, -2};
              }),
              HasSubstr("stop_token_ids[1] = -2"));
  EXPECT_THAT(message([](GenerationRequest& r) { r.window = 0; }),
              HasSubstr("window must be >= 1, got 0"));
  EXPECT_THAT(message([](GenerationRequest& r) { r.passes = 5; }),
              HasSubstr("passes (K) must be in [0, 4], got 5"));
  EXPECT_THAT(message([](GenerationRequest& r) {
                r.method = DraftMethod::kNgram;
                r.passes = 2;
              }),
              HasSubstr("with the n-gram method"));
  EXPECT_THAT(message([](GenerationRequest& r) { r.window = 17; }),
              HasSubstr("exceeds the drafter's block size 16"));
  EXPECT_THAT(message([](GenerationRequest& r) {
                r.method = DraftMethod::kHybrid;
                r.window = 12;
              }),
              HasSubstr("n-gram method's largest window 8"));
  // Target-only requests (K = 0) may ask any W up to the context.
  EXPECT_EQ(message([](GenerationRequest& r) {
              r.window = 40;
              r.passes = 0;
            }),
            "");
}

}  // namespace
}  // namespace dedit
