// ProposalMix input construction, slot loss weights, the weighted loss and
// the block batches the drafter trainer builds.
#include "training/proposal_mix.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "training/drafter_trainer.h"

namespace dedit::training {
namespace {

at::Tensor Long(std::vector<int64_t> v) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong));
}

TEST(SlotLossWeightsTest, DecayExponentiallyFromOneAtSlotOne) {
  at::Tensor w = SlotLossWeights(16, 7.0);
  ASSERT_EQ(w.size(0), 15);
  for (int k = 1; k <= 15; ++k) {
    EXPECT_NEAR(w[k - 1].item<float>(), std::exp(-(k - 1) / 7.0), 1e-6) << k;
  }
  EXPECT_FLOAT_EQ(w[0].item<float>(), 1.0f);
}

TEST(WeightedSlotLossTest, WeightsSlotsAndIgnoresInvalidOnes) {
  // Two blocks of W = 4 (3 slots), vocab 5.
  at::Tensor logits = at::randn({2, 3, 5});
  at::Tensor targets = Long({0, 1, 2, 3, 4, 0}).view({2, 3});
  at::Tensor valid = at::tensor(std::vector<int64_t>{1, 1, 1, 1, 0, 0},
                                at::TensorOptions().dtype(at::kLong))
                         .view({2, 3})
                         .to(at::kBool);
  at::Tensor w = SlotLossWeights(4, 2.0);
  const double loss =
      WeightedSlotLoss(logits, targets, valid, w).item<double>();
  at::Tensor logp = at::log_softmax(logits, -1);
  double num = 0, den = 0;
  for (int b = 0; b < 2; ++b) {
    for (int k = 0; k < 3; ++k) {
      if (!valid[b][k].item<bool>()) continue;
      const double wk = std::exp(-k / 2.0);
      num += -wk * logp[b][k][targets[b][k].item<int64_t>()].item<double>();
      den += wk;
    }
  }
  EXPECT_NEAR(loss, num / den, 1e-5);
}

TEST(BuildEditInputTest, ConfidentSlotsTakeGroundTruthOthersKeepProposal) {
  // block = [anchor 9, truth 1 2 3 4]; proposal = [1 7 3 8].
  at::Tensor block = Long({9, 1, 2, 3, 4}).view({1, 5});
  at::Tensor proposal = Long({1, 7, 3, 8}).view({1, 4});
  at::Tensor conf =
      at::tensor(std::vector<float>{0.9f, 0.8f, 0.2f, 0.4f}).view({1, 4});
  at::Tensor valid = at::ones({1, 4}, at::TensorOptions().dtype(at::kBool));
  EditInput in = BuildEditInput(block, proposal, conf, valid, 0.5, true);
  // Slot 1: confident + correct -> 1; slot 2: confident + wrong -> truth 2
  // (an overwrite); slots 3, 4: unconfident -> the proposal 3, 8.
  std::vector<int64_t> want = {9, 1, 2, 3, 8};
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(in.tokens[0][i].item<int64_t>(), want[i]) << i;
  EXPECT_DOUBLE_EQ(in.rates.p1_accuracy, 2.0 / 4);   // slots 1 and 3
  EXPECT_DOUBLE_EQ(in.rates.gt_selection, 2.0 / 4);  // slots 1 and 2
  EXPECT_DOUBLE_EQ(in.rates.overwrite, 1.0 / 4);     // slot 2
}

TEST(BuildEditInputTest, MarksTheSlotsThatTookTheGroundTruth) {
  at::Tensor block = Long({9, 1, 2, 3, 4}).view({1, 5});
  at::Tensor proposal = Long({1, 7, 3, 8}).view({1, 4});
  at::Tensor conf =
      at::tensor(std::vector<float>{0.9f, 0.8f, 0.2f, 0.9f}).view({1, 4});
  at::Tensor valid =
      at::tensor(std::vector<int64_t>{1, 1, 1, 0}).view({1, 4}).to(at::kBool);
  EditInput mixed = BuildEditInput(block, proposal, conf, valid, 0.5, true);
  // Slots 1 and 2 confident; slot 4 confident but past the end.
  const std::vector<bool> want = {true, true, false, false};
  for (int k = 0; k < 4; ++k)
    EXPECT_EQ(mixed.selected[0][k].item<bool>(), want[k]) << k;
  EditInput plain = BuildEditInput(block, proposal, conf, valid, 0.5, false);
  EXPECT_FALSE(plain.selected.any().item<bool>());
}

// The edit loss can weigh the slots whose input is already the label apart
// from the ones that hold P1's guess; invalid slots weigh nothing.
TEST(EditLossWeightsTest, WeighSelectedSlotsApartAndDropInvalidOnes) {
  at::Tensor w = SlotLossWeights(4, 2.0);  // 3 slots
  at::Tensor selected = at::tensor(std::vector<int64_t>{1, 0, 1, 0, 1, 0})
                            .view({2, 3})
                            .to(at::kBool);
  at::Tensor valid = at::tensor(std::vector<int64_t>{1, 1, 1, 1, 0, 0})
                         .view({2, 3})
                         .to(at::kBool);
  at::Tensor got = EditLossWeights(w, selected, valid, 0.25);
  ASSERT_EQ(got.sizes(), selected.sizes());
  const float want[2][3] = {{0.25f * w[0].item<float>(), w[1].item<float>(),
                             0.25f * w[2].item<float>()},
                            {w[0].item<float>(), 0.0f, 0.0f}};
  for (int b = 0; b < 2; ++b) {
    for (int k = 0; k < 3; ++k)
      EXPECT_FLOAT_EQ(got[b][k].item<float>(), want[b][k]) << b << "," << k;
  }
  // Weight 1 is the plain slot weighting; weight 0 makes the loss ignore
  // the selected slots: a wrong prediction there costs nothing.
  at::Tensor logits = at::randn({2, 3, 5});
  at::Tensor targets = Long({0, 1, 2, 3, 4, 0}).view({2, 3});
  EXPECT_NEAR(WeightedSlotLoss(logits, targets, valid,
                               EditLossWeights(w, selected, valid, 1.0))
                  .item<double>(),
              WeightedSlotLoss(logits, targets, valid, w).item<double>(), 1e-6);
  at::Tensor zero = EditLossWeights(w, selected, valid, 0.0);
  const double before =
      WeightedSlotLoss(logits, targets, valid, zero).item<double>();
  at::Tensor changed = logits.clone();
  changed[0][0] = at::randn({5}) * 10;  // a selected slot
  changed[0][2] = at::randn({5}) * 10;
  EXPECT_NEAR(WeightedSlotLoss(changed, targets, valid, zero).item<double>(),
              before, 1e-6);
  changed[0][1] = at::randn({5}) * 10;  // a kept slot
  EXPECT_GT(
      std::abs(WeightedSlotLoss(changed, targets, valid, zero).item<double>() -
               before),
      1e-4);
}

TEST(BuildEditInputTest, ThresholdIsInclusive) {
  at::Tensor block = Long({9, 1}).view({1, 2});
  at::Tensor proposal = Long({5}).view({1, 1});
  at::Tensor conf = at::full({1, 1}, 0.5f);
  at::Tensor valid = at::ones({1, 1}, at::TensorOptions().dtype(at::kBool));
  EXPECT_EQ(BuildEditInput(block, proposal, conf, valid, 0.5, true)
                .tokens[0][1]
                .item<int64_t>(),
            1);
}

TEST(BuildEditInputTest, WithoutProposalMixTheInputIsThePlainProposal) {
  at::Tensor block = Long({9, 1, 2, 3}).view({1, 4});
  at::Tensor proposal = Long({6, 7, 8}).view({1, 3});
  at::Tensor conf = at::full({1, 3}, 0.99f);
  at::Tensor valid = at::ones({1, 3}, at::TensorOptions().dtype(at::kBool));
  EditInput in = BuildEditInput(block, proposal, conf, valid, 0.5, false);
  std::vector<int64_t> want = {9, 6, 7, 8};
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(in.tokens[0][i].item<int64_t>(), want[i]);
  EXPECT_DOUBLE_EQ(in.rates.gt_selection, 1.0);  // still measured
}

TEST(BuildEditInputTest, InvalidSlotsKeepTheProposalAndAreNotCounted) {
  at::Tensor block = Long({9, 1, 0}).view({1, 3});  // slot 2 past the end
  at::Tensor proposal = Long({1, 5}).view({1, 2});
  at::Tensor conf = at::full({1, 2}, 0.9f);
  at::Tensor valid = at::tensor(std::vector<int64_t>{1, 0},
                                at::TensorOptions().dtype(at::kLong))
                         .view({1, 2})
                         .to(at::kBool);
  EditInput in = BuildEditInput(block, proposal, conf, valid, 0.5, true);
  EXPECT_EQ(in.tokens[0][2].item<int64_t>(), 5);
  EXPECT_DOUBLE_EQ(in.rates.p1_accuracy, 1.0);
  EXPECT_DOUBLE_EQ(in.rates.gt_selection, 1.0);
}

// The adaptive threshold selects the ground truth for ratio x (correct P1
// slots) of the valid slots, the most confident ones, so that the editor's
// input is mostly right where P1 is right (paper, Table 6).
TEST(AdaptiveEtaTest, SelectsRatioTimesCorrectSlotsByConfidence) {
  // 8 valid slots, 4 of them correct; one invalid slot, the most confident.
  at::Tensor truth = Long({1, 2, 3, 4, 5, 6, 7, 8, 9}).view({1, 9});
  at::Tensor proposal = Long({1, 2, 3, 4, 0, 0, 0, 0, 9}).view({1, 9});
  at::Tensor conf = at::tensor(std::vector<float>{0.9f, 0.2f, 0.8f, 0.1f, 0.7f,
                                                  0.3f, 0.6f, 0.4f, 0.99f})
                        .view({1, 9});
  at::Tensor valid = at::tensor(std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 0},
                                at::TensorOptions().dtype(at::kLong))
                         .view({1, 9})
                         .to(at::kBool);
  // ratio 0.75 x 4 correct = 3 slots: the third most confident valid slot.
  const double eta = AdaptiveEta(proposal, conf, truth, valid, 0.75);
  EXPECT_FLOAT_EQ(eta, 0.7f);
  EditInput in = BuildEditInput(at::cat({Long({0}).view({1, 1}), truth}, -1),
                                proposal, conf, valid, eta, true);
  EXPECT_NEAR(in.rates.gt_selection, 3.0 / 8, 1e-9);
  EXPECT_NEAR(in.rates.p1_accuracy, 4.0 / 8, 1e-9);
  // No correct slot: nothing is selected.
  EXPECT_GT(AdaptiveEta(Long({0, 0, 0, 0, 0, 0, 0, 0, 0}).view({1, 9}), conf,
                        truth, valid, 0.875),
            1.0);
}

TEST(MakeBlockBatchTest, AnchorsLieInTheContinuationAndSlotsFollowThem) {
  DistillRecord a{4, {10, 11, 12, 13, 14, 15, 16, 17, 18, 19}};
  DistillRecord b{2, {20, 21, 22, 23, 24, 25}};
  std::mt19937_64 rng(1);
  const int w = 4;
  BlockBatch batch =
      MakeBlockBatch({&a, &b}, 8, w, /*mask_id=*/99, /*pad_id=*/0, &rng);
  ASSERT_EQ(batch.ids.size(1), 10);
  EXPECT_EQ(batch.ids[1][6].item<int64_t>(), 0);  // padding
  const DistillRecord* recs[] = {&a, &b};
  for (int s = 0; s < 2; ++s) {
    const int64_t len = static_cast<int64_t>(recs[s]->tokens.size());
    for (int j = 0; j < 8; ++j) {
      const int64_t anchor = batch.anchors[s][j].item<int64_t>();
      EXPECT_GE(anchor, recs[s]->prompt_len);
      EXPECT_LE(anchor, len - 2);
      EXPECT_EQ(batch.p1_tokens[s][j][0].item<int64_t>(),
                recs[s]->tokens[anchor]);
      for (int k = 1; k < w; ++k) {
        EXPECT_EQ(batch.p1_tokens[s][j][k].item<int64_t>(), 99);
        const bool inside = anchor + k < len;
        EXPECT_EQ(batch.valid[s][j][k - 1].item<bool>(), inside);
        EXPECT_EQ(batch.truth[s][j][k].item<int64_t>(),
                  inside ? recs[s]->tokens[anchor + k] : 0);
      }
    }
  }
}

// The engine's tau: rounds walk the answer, each anchored where the last
// one's tokens end.
TEST(WalkRoundsTest, CountsTokensPerRoundAsTheEngineDoes) {
  // Prompt of 2, an answer of 10 tokens: 9 to commit after the first.
  DistillRecord a{2, {1, 2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}};
  DistillRecord b{3, {1, 2, 3, 30, 31, 32}};  // 2 to commit
  const int w = 4;
  // A perfect drafter: every round commits W tokens (the end caps the last).
  auto truth = [](const BlockBatch& batch) {
    return batch.truth.narrow(-1, 1, batch.truth.size(-1) - 1);
  };
  Rounds perfect = WalkRounds({&a}, w, 99, 0, truth);
  EXPECT_EQ(perfect.tokens, 9);
  EXPECT_EQ(perfect.rounds, 3);  // 4 + 4 + 1
  // A drafter that is never right: one token per round.
  auto wrong = [](const BlockBatch& batch) {
    return at::full_like(batch.truth.narrow(-1, 1, batch.truth.size(-1) - 1),
                         7);
  };
  Rounds none = WalkRounds({&a, &b}, w, 99, 0, wrong);
  EXPECT_EQ(none.tokens, 11);
  EXPECT_EQ(none.rounds, 11);
  EXPECT_DOUBLE_EQ(none.tau(), 1.0);
  // Right only in the round anchored at the answer's first token: that
  // round commits 4 (slots 3, 4, 5 and the bonus), then one per round from
  // position 6: 9 tokens in 6 rounds.
  auto first_only = [&](const BlockBatch& batch) {
    at::Tensor t = truth(batch).clone();
    if (batch.anchors[0][0].item<int64_t>() != 2) t.fill_(7);
    return t;
  };
  Rounds some = WalkRounds({&a}, w, 99, 0, first_only);
  EXPECT_EQ(some.tokens, 9);
  EXPECT_EQ(some.rounds, 6);
  EXPECT_DOUBLE_EQ(some.tau(), 1.5);
}

// On-policy anchors: each walk moves as the engine's rounds would, and
// lands where its next round would be anchored.
TEST(RoundAnchorsTest, LandWhereTheEnginesNextRoundWouldBe) {
  // Positions 2..11 are the answer; anchors may go up to 10.
  DistillRecord a{2, {1, 2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}};
  DistillRecord b{3, {1, 2, 3, 30, 31, 32, 33, 34, 35}};  // up to 7
  const int w = 4;
  auto truth = [](const BlockBatch& batch) {
    return batch.truth.narrow(-1, 1, batch.truth.size(-1) - 1);
  };
  // A perfect drafter commits W tokens a round (3 accepted + the bonus);
  // a walk past the last anchor restarts at its start.
  EXPECT_EQ(RoundAnchors({&a, &b}, {{2, 5}, {3, 4}}, 2, w, 99, 0, truth),
            (std::vector<std::vector<int64_t>>{{10, 5}, {3, 4}}));
  // 2 -> 6 -> 10 stays; 5 -> 9 -> 12 restarts; in b 3 -> 7 -> 9 and
  // 4 -> 8 restart.
  // A drafter that is never right: one token a round.
  auto wrong = [](const BlockBatch& batch) {
    return at::full_like(batch.truth.narrow(-1, 1, batch.truth.size(-1) - 1),
                         7);
  };
  EXPECT_EQ(RoundAnchors({&a, &b}, {{2, 5}, {3, 4}}, 2, w, 99, 0, wrong),
            (std::vector<std::vector<int64_t>>{{4, 7}, {5, 6}}));
  // Right only in blocks anchored at 2: that walk jumps 4, then creeps.
  auto at_two = [&](const BlockBatch& batch) {
    return at::where(batch.anchors.eq(2).unsqueeze(-1), truth(batch),
                     at::full_like(truth(batch), 7));
  };
  EXPECT_EQ(RoundAnchors({&a}, {{2, 3}}, 3, w, 99, 0, at_two),
            (std::vector<std::vector<int64_t>>{{8, 6}}));
  // No rounds: the starts themselves.
  EXPECT_EQ(RoundAnchors({&a}, {{2, 3}}, 0, w, 99, 0, at_two),
            (std::vector<std::vector<int64_t>>{{2, 3}}));
}

// The warm-up ends after `patience` flat evaluations in a row, not at the
// first noisy one; a rise in between starts the count again.
TEST(PlateauRuleTest, NeedsPatienceFlatEvaluationsInARow) {
  PlateauRule rule{/*delta=*/0.005, /*patience=*/2};
  EXPECT_FALSE(rule.Update(0.12));  // the first evaluation has no "before"
  EXPECT_FALSE(rule.Update(0.17));
  EXPECT_FALSE(rule.Update(0.172));  // flat once
  EXPECT_FALSE(rule.Update(0.20));   // rising again: the count restarts
  EXPECT_FALSE(rule.Update(0.201));  // flat once
  EXPECT_TRUE(rule.Update(0.199));   // flat twice in a row
  PlateauRule impatient{/*delta=*/0.005, /*patience=*/1};
  EXPECT_FALSE(impatient.Update(0.12));
  EXPECT_TRUE(impatient.Update(0.121));
}

}  // namespace
}  // namespace dedit::training
