#include "model/dedit_drafter.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <fstream>

#include "base/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/tensor_io.h"
#include "tests/model/test_util.h"

namespace dedit {
namespace {

using ::testing::HasSubstr;
using testing::MakeTempDir;
using testing::MakeTinyPair;
using testing::RandomPrompt;
using testing::TestDevice;

const std::string kGolden = testing::GoldenDir();

at::Tensor Expected(const std::string& name) {
  return testing::GoldenTensor(name);
}

// The golden target + drafter, with the prompt's context appended.
struct GoldenSetup {
  std::unique_ptr<Qwen3Model> target;
  std::unique_ptr<DEditDrafter> drafter;
  int64_t start = 0;
  int32_t bonus = 0;
};

GoldenSetup LoadGolden() {
  GoldenSetup g;
  Qwen3Model::Options topts;
  topts.device = TestDevice();
  topts.feature_layer_ids = {0, 2};
  g.target = std::move(*Qwen3Model::Load(kGolden + "/target", topts));
  DEditDrafter::Options dopts;
  dopts.device = TestDevice();
  auto d = DEditDrafter::Load(kGolden + "/drafter", g.target->embed_tokens(),
                              g.target->lm_head(), dopts);
  EXPECT_TRUE(d.ok()) << d.status();
  g.drafter = std::move(*d);
  at::Tensor ids = Expected("input_ids");
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < ids.numel(); ++i)
    prompt.push_back(ids[i].item<int64_t>());
  EXPECT_TRUE(g.target->AddSequence(1).ok());
  auto out = g.target->Forward(
      {{1, prompt, 0, {static_cast<int>(prompt.size()) - 1}}});
  EXPECT_TRUE(out.ok());
  EXPECT_TRUE(g.drafter->AddSequence(1).ok());
  // Append in two chunks: the cache must not care how context arrives.
  EXPECT_TRUE(
      g.drafter->AppendContext(1, 0, out->features.narrow(0, 0, 4)).ok());
  EXPECT_TRUE(
      g.drafter->AppendContext(1, 4, out->features.narrow(0, 4, 7)).ok());
  g.start = static_cast<int64_t>(prompt.size());
  g.bonus = out->logits.argmax(-1).item<int64_t>();
  return g;
}

// Checks one pass against reference logits (rows 1..W-1 are the proposal).
void ExpectPassMatches(const DraftPass& pass, const at::Tensor& logits) {
  at::Tensor rows = logits.narrow(0, 1, logits.size(0) - 1);
  at::Tensor probs = at::softmax(rows, -1);
  auto [conf, arg] = probs.max(-1);
  ASSERT_EQ(pass.tokens.size(), static_cast<size_t>(rows.size(0)));
  for (int64_t i = 0; i < rows.size(0); ++i) {
    EXPECT_EQ(pass.tokens[i], arg[i].item<int64_t>()) << "slot " << i + 1;
    EXPECT_NEAR(pass.confidences[i], conf[i].item<double>(), 1e-4);
  }
}

TEST(DEditDrafterTest, MatchesIndependentPythonReference) {
  GoldenSetup g = LoadGolden();
  EXPECT_EQ(g.bonus, Expected("block_p1_tokens")[0].item<int64_t>());
  EXPECT_EQ(g.drafter->config().num_passes, 3);
  auto r = g.drafter->Draft({{1, g.start, g.bonus, 8, 2}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ((*r)[0].passes.size(), 2u);
  ExpectPassMatches((*r)[0].passes[0], Expected("drafter_p1_logits"));
  // P2 consumed P1's proposal: its input was [bonus, argmax P1], exactly the
  // reference's block_p2_tokens.
  at::Tensor p2_in = Expected("block_p2_tokens");
  for (int i = 1; i < 8; ++i) {
    EXPECT_EQ((*r)[0].passes[0].tokens[i - 1], p2_in[i].item<int64_t>());
  }
  ExpectPassMatches((*r)[0].passes[1], Expected("drafter_p2_logits"));
}

// The causal editor (the paper's ablation) shares the bidirectional P1 and
// masks later slots in the edit passes only; the trainer's causal
// BlockLogits, checked against the Python reference, pins P2 itself
// (tests/training/trainable_models_test.cc).
TEST(DEditDrafterTest, CausalEditorKeepsP1AndChangesTheEdits) {
  GoldenSetup g = LoadGolden();
  auto bidir = g.drafter->Draft({{1, g.start, g.bonus, 8, 2}});
  g.drafter->set_causal_editor(true);
  auto causal = g.drafter->Draft({{1, g.start, g.bonus, 8, 2}});
  ASSERT_TRUE(bidir.ok() && causal.ok());
  ExpectPassMatches((*causal)[0].passes[0], Expected("drafter_p1_logits"));
  EXPECT_EQ((*bidir)[0].passes[0].confidences,
            (*causal)[0].passes[0].confidences);
  EXPECT_NE((*bidir)[0].passes[1].confidences,
            (*causal)[0].passes[1].confidences);
}

TEST(DEditDrafterTest, DraftLeavesContextUnchangedAndIsDeterministic) {
  GoldenSetup g = LoadGolden();
  auto three = g.drafter->Draft({{1, g.start, g.bonus, 8, 3}});
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(*g.drafter->ContextLength(1), g.start);
  auto two = g.drafter->Draft({{1, g.start, g.bonus, 8, 2}});
  ASSERT_TRUE(two.ok());
  // Later passes only extend the list: the first two passes agree.
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ((*three)[0].passes[k].tokens, (*two)[0].passes[k].tokens);
  }
  EXPECT_EQ(*g.drafter->ContextLength(1), g.start);
}

TEST(DEditDrafterTest, BatchedDraftEqualsEachAlone) {
  auto spec = DefaultTinySpec();
  auto pair = MakeTinyPair(spec, 21);
  DEditDrafter& d = *pair->drafter;
  const int fw = d.feature_width();
  struct Seq {
    SequenceId id;
    int ctx;
    int window;
    int passes;
    int32_t bonus;
  };
  const std::vector<Seq> seqs = {
      {1, 5, 8, 3, 7}, {2, 40, 32, 1, 9}, {3, 12, 2, 2, 100}};
  for (const Seq& s : seqs) {
    ASSERT_TRUE(d.AddSequence(s.id).ok());
    at::Tensor f = at::randn({s.ctx, fw}).to(TestDevice());
    ASSERT_TRUE(d.AppendContext(s.id, 0, f).ok());
  }
  std::vector<DraftRequest> reqs;
  for (const Seq& s : seqs)
    reqs.push_back({s.id, s.ctx, s.bonus, s.window, s.passes});
  auto batched = d.Draft(reqs);
  ASSERT_TRUE(batched.ok()) << batched.status();
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto alone = d.Draft({reqs[i]});
    ASSERT_TRUE(alone.ok());
    ASSERT_EQ((*batched)[i].passes.size(), static_cast<size_t>(seqs[i].passes));
    for (int k = 0; k < seqs[i].passes; ++k) {
      EXPECT_EQ((*batched)[i].passes[k].tokens, (*alone)[0].passes[k].tokens);
      for (size_t j = 0; j < (*alone)[0].passes[k].confidences.size(); ++j) {
        EXPECT_NEAR((*batched)[i].passes[k].confidences[j],
                    (*alone)[0].passes[k].confidences[j], 1e-5);
      }
      EXPECT_EQ((*batched)[i].passes[k].tokens.size(),
                static_cast<size_t>(seqs[i].window - 1));
    }
  }
}

TEST(DEditDrafterTest, BadRequestsAreErrors) {
  auto pair = MakeTinyPair(DefaultTinySpec(), 22);
  DEditDrafter& d = *pair->drafter;
  ASSERT_TRUE(d.AddSequence(1).ok());
  ASSERT_TRUE(d.AppendContext(1, 0, at::randn({4, d.feature_width()})).ok());
  struct Case {
    DraftRequest r;
    absl::StatusCode code;
    const char* msg;
  };
  const Case cases[] = {
      {{1, 4, 3, 33, 1}, absl::StatusCode::kInvalidArgument, "block size"},
      {{1, 4, 3, 1, 1}, absl::StatusCode::kInvalidArgument, "window"},
      {{1, 4, 3, 8, 0}, absl::StatusCode::kInvalidArgument, "passes"},
      {{1, 5, 3, 8, 1}, absl::StatusCode::kFailedPrecondition, "context"},
      {{2, 4, 3, 8, 1}, absl::StatusCode::kNotFound, "unknown"},
      {{1, 4, 128, 8, 1}, absl::StatusCode::kInvalidArgument, "bonus"},
  };
  for (const Case& c : cases) {
    auto r = d.Draft({c.r});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.msg));
  }
  EXPECT_FALSE(d.AppendContext(1, 4, at::randn({2, 3})).ok());
  EXPECT_FALSE(d.AppendContext(1, 3, at::randn({2, d.feature_width()})).ok());
  EXPECT_EQ(*d.ContextLength(1), 4);
}

// A checkpoint laid out exactly like z-lab's released DFlash drafters
// (tensor names, config keys, bf16 on disk), scaled down, must load and
// draft as a P1-only drafter.
TEST(DEditDrafterTest, ZLabDFlashCheckpointLoadsAndDrafts) {
  auto spec = DefaultTinySpec();
  auto pair = MakeTinyPair(spec, 23);
  const std::string dir = MakeTempDir();
  DrafterConfig cfg = spec.drafter;
  cfg.has_dedit_config = false;
  cfg.block_size = 16;
  cfg.layers.dtype = "bfloat16";
  ASSERT_TRUE(WriteRandomDrafter(dir, cfg, 77).ok());
  // Rewrite config.json the way z-lab publishes it.
  std::ofstream(dir + "/config.json") << R"({
    "architectures": ["DFlashDraftModel"], "attention_bias": false,
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "block_size": 16,
    "dflash_config": {"mask_token_id": 127, "target_layer_ids": [1, 2]},
    "dtype": "bfloat16", "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
    "intermediate_size": 128, "layer_types": ["full_attention", "full_attention"],
    "max_position_embeddings": 2048, "model_type": "qwen3",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "num_target_layers": 4, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 10000, "tie_word_embeddings": false, "vocab_size": 128})";
  auto archive = WeightArchive::OpenDirectory(dir);
  ASSERT_TRUE(archive.ok());
  EXPECT_TRUE((*archive)->Contains("fc.weight"));
  EXPECT_TRUE((*archive)->Contains("layers.1.self_attn.k_norm.weight"));
  EXPECT_EQ((*(*archive)->Get("fc.weight")).dtype, DType::kBF16);
  DEditDrafter::Options opts;
  opts.device = TestDevice();
  auto d = DEditDrafter::Load(dir, pair->target->embed_tokens(),
                              pair->target->lm_head(), opts);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->config().num_passes, 1);
  EXPECT_EQ((*d)->config().block_size, 16);
  ASSERT_TRUE((*d)->AddSequence(1).ok());
  ASSERT_TRUE((*d)->AppendContext(1, 0, at::randn({6, 128})).ok());
  auto r = (*d)->Draft({{1, 6, 5, 16, 1}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].passes[0].tokens.size(), 15u);
}

TEST(DEditDrafterTest, DrafterMustFitTargetEmbeddings) {
  DEditDrafter::Options opts;
  // The golden drafter has hidden size 64; a target of width 32 cannot feed it.
  auto d = DEditDrafter::Load(kGolden + "/drafter", at::randn({128, 32}),
                              at::randn({128, 32}), opts);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("hidden size 64"));
  // A mask token outside a smaller target vocabulary is refused too.
  d = DEditDrafter::Load(kGolden + "/drafter", at::randn({90, 64}),
                         at::randn({90, 64}), opts);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("mask_token_id"));
}

}  // namespace
}  // namespace dedit
