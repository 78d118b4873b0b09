#include "common/engine/ngram_drafter.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dedit {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(NgramDrafterTest, CopiesWhatFollowedTheLatestMatchOfTheLongestSuffix) {
  NgramDrafter ngram({.min_ngram = 1, .max_ngram = 3, .max_window = 16});
  // Suffix [7, 8] occurs twice; the latest occurrence (followed by 4, 5)
  // wins over the earlier one (followed by 1, 2).
  const std::vector<int32_t> known = {7, 8, 1, 2, 9, 7, 8, 4, 5, 6, 7, 8};
  EXPECT_THAT(ngram.Propose(known, 3), ElementsAre(4, 5, 6));
  // A longer suffix that matches beats a shorter one: [1, 2, 3] matched at
  // the start (then 9, 2) wins over the later [2, 3] (then 5, 1).
  EXPECT_THAT(ngram.Propose({1, 2, 3, 9, 2, 3, 5, 1, 2, 3}, 2),
              ElementsAre(9, 2));
}

TEST(NgramDrafterTest, ContinuesOverItsOwnProposalForRepeatingText) {
  NgramDrafter ngram;
  // "a , a , a" : the match is one period back, so the copy runs past the
  // known tokens into the proposal itself and keeps the pattern.
  const std::vector<int32_t> known = {5, 1, 2, 1, 2, 1};
  EXPECT_THAT(ngram.Propose(known, 7), ElementsAre(2, 1, 2, 1, 2, 1, 2));
}

TEST(NgramDrafterTest, NoMatchProposesNothing) {
  NgramDrafter ngram({.min_ngram = 2, .max_ngram = 4, .max_window = 16});
  EXPECT_THAT(ngram.Propose({1, 2, 3, 4, 5}, 8), IsEmpty());
  EXPECT_THAT(ngram.Propose({1}, 8), IsEmpty());
  EXPECT_THAT(ngram.Propose({3, 3}, 0), IsEmpty());
}

TEST(NgramDrafterTest, DraftChecksTheRequestAndReturnsOnePass) {
  NgramDrafter ngram({.min_ngram = 1, .max_ngram = 2, .max_window = 8});
  const std::vector<int32_t> known = {4, 5, 6, 4, 5};
  DraftRequest r{.sequence = 3,
                 .start = 4,
                 .bonus = 5,
                 .window = 4,
                 .passes = 1,
                 .tokens = &known};
  auto d = ngram.Draft({r});
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 1u);
  ASSERT_EQ((*d)[0].passes.size(), 1u);
  EXPECT_THAT((*d)[0].passes[0].tokens, ElementsAre(6, 4, 5));
  EXPECT_EQ((*d)[0].passes[0].confidences.size(), 3u);

  DraftRequest no_tokens = r;
  no_tokens.tokens = nullptr;
  EXPECT_THAT(ngram.Draft({no_tokens}).status().message(),
              HasSubstr("known tokens"));
  DraftRequest stale = r;
  stale.start = 7;  // the engine's count disagrees with the tokens
  EXPECT_FALSE(ngram.Draft({stale}).ok());
  DraftRequest wide = r;
  wide.window = 9;
  EXPECT_THAT(ngram.Draft({wide}).status().message(), HasSubstr("window 9"));
  DraftRequest two_passes = r;
  two_passes.passes = 2;
  EXPECT_EQ(ngram.Draft({two_passes}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NgramDrafterTest, ValidateRejectsImpossibleSizes) {
  EXPECT_TRUE(NgramDrafter::Validate({}).ok());
  EXPECT_FALSE(NgramDrafter::Validate({.min_ngram = 0}).ok());
  EXPECT_FALSE(NgramDrafter::Validate({.min_ngram = 3, .max_ngram = 2}).ok());
  EXPECT_FALSE(NgramDrafter::Validate({.max_window = 1}).ok());
}

}  // namespace
}  // namespace dedit
