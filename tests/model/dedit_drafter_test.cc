#include "common/model/dedit_drafter.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <fstream>

#include "absl/cleanup/cleanup.h"
#include "common/base/safetensors.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/local_backends.h"
#include "common/model/tensor_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

// The same on the CPU's f32 weight panels, where the context rows take the
// drafter's fused append (AppendContextRowsCpu: fc, norm, each layer's K
// norm and RoPE in loops over raw rows) instead of the ATen ops, and the
// products' sums run in another order: still the Python reference's
// logits, to the same tolerance.
TEST(DEditDrafterTest, MatchesIndependentPythonReferenceOnF32Panels) {
  if (TestDevice().is_cuda() || !CpuRuns(CpuProducts::kF32)) {
    GTEST_SKIP() << "f32 panels need a CPU with AVX2+FMA or AVX-512";
  }
  SetCpuProducts(CpuProducts::kF32);
  absl::Cleanup blas = [] { SetCpuProducts(CpuProducts::kBlas); };
  GoldenSetup g = LoadGolden();
  EXPECT_EQ(g.bonus, Expected("block_p1_tokens")[0].item<int64_t>());
  auto r = g.drafter->Draft({{1, g.start, g.bonus, 8, 2}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ((*r)[0].passes.size(), 2u);
  ExpectPassMatches((*r)[0].passes[0], Expected("drafter_p1_logits"));
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

void ExpectSameDrafts(const std::vector<DraftResult>& got,
                      const std::vector<DraftResult>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].passes.size(), want[i].passes.size()) << i;
    for (size_t k = 0; k < got[i].passes.size(); ++k) {
      EXPECT_EQ(got[i].passes[k].tokens, want[i].passes[k].tokens)
          << i << " pass " << k;
      ASSERT_EQ(got[i].passes[k].confidences.size(),
                want[i].passes[k].confidences.size());
      for (size_t j = 0; j < got[i].passes[k].confidences.size(); ++j) {
        EXPECT_NEAR(got[i].passes[k].confidences[j],
                    want[i].passes[k].confidences[j], 1e-5);
      }
    }
  }
}

// Several sequences' chunks appended in one call (one projection per
// layer for all rows) make the context chunk-by-chunk appends make; a call
// with one bad chunk is refused whole, naming it, and changes nothing.
TEST(DEditDrafterTest, AppendContextsEqualsChunkByChunk) {
  auto pair = MakeTinyPair(DefaultTinySpec(), 23);
  DEditDrafter& d = *pair->drafter;
  const int fw = d.feature_width();
  const at::Tensor a = at::randn({11, fw}).to(TestDevice());
  const at::Tensor b = at::randn({6, fw}).to(TestDevice());
  // 1 and 2 one chunk at a time; 11 and 12 the same rows in one call,
  // interleaved, with an empty chunk among them.
  for (SequenceId id : {1, 2, 11, 12}) ASSERT_TRUE(d.AddSequence(id).ok());
  ASSERT_TRUE(d.AppendContext(1, 0, a.narrow(0, 0, 8)).ok());
  ASSERT_TRUE(d.AppendContext(2, 0, b.narrow(0, 0, 4)).ok());
  ASSERT_TRUE(d.AppendContext(1, 8, a.narrow(0, 8, 3)).ok());
  ASSERT_TRUE(d.AppendContext(2, 4, b.narrow(0, 4, 2)).ok());
  ASSERT_TRUE(d.AppendContexts({{11, 0, a.narrow(0, 0, 8)},
                                {12, 0, b.narrow(0, 0, 4)},
                                {11, 8, a.narrow(0, 8, 3)},
                                {12, 4, b.narrow(0, 4, 0)},
                                {12, 4, b.narrow(0, 4, 2)}})
                  .ok());
  EXPECT_EQ(*d.ContextLength(11), 11);
  EXPECT_EQ(*d.ContextLength(12), 6);
  auto one_by_one = d.Draft({{1, 11, 5, 8, 2}, {2, 6, 9, 16, 1}});
  auto batched = d.Draft({{11, 11, 5, 8, 2}, {12, 6, 9, 16, 1}});
  ASSERT_TRUE(one_by_one.ok()) << one_by_one.status();
  ASSERT_TRUE(batched.ok()) << batched.status();
  ExpectSameDrafts(*batched, *one_by_one);

  struct Case {
    std::vector<DEditDrafter::ContextChunk> chunks;
    absl::StatusCode code;
    const char* msg;
  };
  const at::Tensor row = at::randn({1, fw});
  const Case cases[] = {
      // The second chunk of 11 leaves a gap after the first.
      {{{11, 11, row}, {11, 13, row}},
       absl::StatusCode::kInvalidArgument,
       "starts at 13 but 12"},
      {{{11, 11, row}, {99, 0, row}}, absl::StatusCode::kNotFound, "99"},
      {{{12, 6, row}, {11, 11, at::randn({1, 3})}},
       absl::StatusCode::kInvalidArgument,
       "features must be"},
      {{{12, 6, row}, {11, 11, at::randn({d.max_context_tokens() - 10, fw})}},
       absl::StatusCode::kOutOfRange,
       "limit"},
  };
  for (const Case& c : cases) {
    const absl::Status status = d.AppendContexts(c.chunks);
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.msg));
    EXPECT_EQ(*d.ContextLength(11), 11);
    EXPECT_EQ(*d.ContextLength(12), 6);
  }
  auto after = d.Draft({{11, 11, 5, 8, 2}, {12, 6, 9, 16, 1}});
  ASSERT_TRUE(after.ok()) << after.status();
  ExpectSameDrafts(*after, *one_by_one);
}

// The in-process drafter side queues the target's context and appends it
// at the next Draft; a chunk that cannot extend its sequence is refused
// when it arrives, as before, and a release drops what is queued.
TEST(DEditDrafterTest, LocalDrafterQueuesContextUntilTheDraft) {
  auto pair = MakeTinyPair(DefaultTinySpec(), 24);
  DEditDrafter& d = *pair->drafter;
  const int fw = d.feature_width();
  const at::Tensor a = at::randn({9, fw}).to(TestDevice());
  LocalDrafter local(&d);
  ASSERT_TRUE(local.OnContext(1, 0, a.narrow(0, 0, 6)).ok());
  ASSERT_TRUE(local.OnContext(1, 6, a.narrow(0, 6, 3)).ok());
  ASSERT_TRUE(local.OnContext(2, 0, a.narrow(0, 0, 4)).ok());
  EXPECT_EQ(*d.ContextLength(1), 0);  // queued, not yet appended
  const absl::Status gap = local.OnContext(2, 5, a.narrow(0, 5, 1));
  EXPECT_EQ(gap.code(), absl::StatusCode::kInvalidArgument) << gap;
  EXPECT_EQ(local.OnContext(3, 2, a.narrow(0, 0, 1)).code(),
            absl::StatusCode::kNotFound);
  auto drafted = local.Draft({{1, 9, 5, 8, 1}, {2, 4, 6, 8, 1}});
  ASSERT_TRUE(drafted.ok()) << drafted.status();
  EXPECT_EQ(*d.ContextLength(1), 9);
  EXPECT_EQ(*d.ContextLength(2), 4);

  // The reference: the same context appended at once.
  ASSERT_TRUE(d.AddSequence(11).ok());
  ASSERT_TRUE(d.AddSequence(12).ok());
  ASSERT_TRUE(d.AppendContext(11, 0, a).ok());
  ASSERT_TRUE(d.AppendContext(12, 0, a.narrow(0, 0, 4)).ok());
  auto want = d.Draft({{11, 9, 5, 8, 1}, {12, 4, 6, 8, 1}});
  ASSERT_TRUE(want.ok()) << want.status();
  ExpectSameDrafts(*drafted, *want);

  // Released with a chunk queued: the chunk goes too, and the sequence
  // starts afresh from a new first chunk.
  ASSERT_TRUE(local.OnContext(2, 4, a.narrow(0, 4, 2)).ok());
  ASSERT_TRUE(local.Release(2).ok());
  EXPECT_FALSE(d.HasSequence(2));
  ASSERT_TRUE(local.OnContext(2, 0, a.narrow(0, 0, 4)).ok());
  drafted = local.Draft({{2, 4, 6, 8, 1}});
  ASSERT_TRUE(drafted.ok()) << drafted.status();
  ExpectSameDrafts(*drafted, {(*want)[1]});

  // Rounds without a Draft (lookups, back-off) do not pile chunks up: the
  // queue is appended once it holds kMaxQueuedChunks.
  const at::Tensor row = at::randn({1, fw}).to(TestDevice());
  const int64_t n = static_cast<int64_t>(LocalDrafter::kMaxQueuedChunks);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(local.OnContext(1, 9 + i, row).ok()) << i;
    EXPECT_EQ(*d.ContextLength(1), i + 1 < n ? 9 : 9 + n) << i;
  }
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
