// AdamW, the learning-rate schedule, and resuming from a saved state: a run
// interrupted and resumed equals the uninterrupted run bit for bit.
#include "training/optimizer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>

#include "training/trainable_models.h"

namespace dedit::training {
namespace {

Qwen3Config Tiny() {
  Qwen3Config c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = true;
  return c;
}

// One training step on a batch that depends only on `step`.
void TrainStep(TrainableTarget& model, AdamW& opt, int64_t step) {
  at::Tensor ids =
      (at::arange(2 * 9, at::TensorOptions().dtype(at::kLong)) * (step + 3))
          .remainder(40)
          .view({2, 9});
  at::Tensor logits =
      model.Logits(model.Forward(ids.narrow(1, 0, 8), {}, nullptr));
  at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, 40}),
                                           ids.narrow(1, 1, 8).reshape({-1}));
  loss.backward();
  opt.Step(LearningRate(step, 4, LearningRateSchedule{}));
}

TEST(LearningRateTest, WarmsUpThenDecaysToTheFinalFraction) {
  LearningRateSchedule s;
  s.peak = 1e-3;
  s.warmup_fraction = 0.1;
  s.final_fraction = 0.1;
  EXPECT_NEAR(LearningRate(0, 100, s), 1e-4, 1e-12);
  EXPECT_NEAR(LearningRate(9, 100, s), 1e-3, 1e-12);
  EXPECT_NEAR(LearningRate(10, 100, s), 1e-3, 1e-12);
  EXPECT_NEAR(LearningRate(99, 100, s), 1e-4, 1e-12);
  EXPECT_LT(LearningRate(60, 100, s), LearningRate(40, 100, s));
}

TEST(AdamWTest, FirstStepMovesEachWeightByLearningRateTimesSign) {
  ParameterList params = {{"w", at::tensor(std::vector<float>{1.0f, -2.0f})
                                    .view({1, 2})
                                    .requires_grad_(true)}};
  AdamWOptions o;
  o.weight_decay = 0;
  o.grad_clip = 0;
  AdamW opt(&params, o);
  (params[0].value * at::tensor(std::vector<float>{3.0f, -0.5f}).view({1, 2}))
      .sum()
      .backward();
  opt.Step(0.1);
  // Bias-corrected first step: update = lr * g / |g|.
  EXPECT_NEAR(params[0].value[0][0].item<float>(), 0.9f, 1e-5);
  EXPECT_NEAR(params[0].value[0][1].item<float>(), -1.9f, 1e-5);
  EXPECT_EQ(opt.steps(), 1);
}

TEST(TrainingStateTest, ResumeRestoresStepOptimizerAndContinuesIdentically) {
  char tmpl[] = "/tmp/dedit_state_test_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string path = dir + "/state.safetensors";

  auto straight = TrainableTarget::Init(Tiny(), 5);
  ASSERT_TRUE(straight.ok());
  AdamW straight_opt(&straight->parameters(), AdamWOptions{});
  for (int64_t s = 0; s < 4; ++s) TrainStep(*straight, straight_opt, s);

  {
    auto first = TrainableTarget::Init(Tiny(), 5);
    AdamW opt(&first->parameters(), AdamWOptions{});
    for (int64_t s = 0; s < 2; ++s) TrainStep(*first, opt, s);
    ASSERT_TRUE(SaveTrainingState(path, first->parameters(), opt, 2,
                                  {{"fingerprint", "abc"}})
                    .ok());
  }
  // A fresh process: different initial weights, zero moments.
  auto resumed = TrainableTarget::Init(Tiny(), 99);
  ASSERT_TRUE(resumed.ok());
  AdamW opt(&resumed->parameters(), AdamWOptions{});
  std::map<std::string, std::string> meta;
  auto step = LoadTrainingState(path, &resumed->parameters(), &opt, &meta);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 2);
  EXPECT_EQ(opt.steps(), 2);
  EXPECT_EQ(meta["fingerprint"], "abc");
  EXPECT_GT(opt.exp_avg_sq()[0].abs().sum().item<double>(), 0);
  for (int64_t s = *step; s < 4; ++s) TrainStep(*resumed, opt, s);

  for (size_t i = 0; i < straight->parameters().size(); ++i) {
    EXPECT_TRUE(at::equal(straight->parameters()[i].value,
                          resumed->parameters()[i].value))
        << straight->parameters()[i].name;
    EXPECT_TRUE(at::equal(straight_opt.exp_avg()[i], opt.exp_avg()[i]));
    EXPECT_TRUE(at::equal(straight_opt.exp_avg_sq()[i], opt.exp_avg_sq()[i]));
  }
}

TEST(TrainingStateTest, RejectsAStateOfAnotherShape) {
  char tmpl[] = "/tmp/dedit_state_test_XXXXXX";
  const std::string path = std::string(mkdtemp(tmpl)) + "/state.safetensors";
  auto small = TrainableTarget::Init(Tiny(), 1);
  AdamW small_opt(&small->parameters(), AdamWOptions{});
  ASSERT_TRUE(
      SaveTrainingState(path, small->parameters(), small_opt, 1, {}).ok());
  Qwen3Config wider = Tiny();
  wider.hidden_size = 48;
  auto other = TrainableTarget::Init(wider, 1);
  AdamW other_opt(&other->parameters(), AdamWOptions{});
  auto step =
      LoadTrainingState(path, &other->parameters(), &other_opt, nullptr);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dedit::training
