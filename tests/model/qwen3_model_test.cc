#include "common/model/qwen3_model.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <filesystem>

#include "common/base/safetensors.h"
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

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kCPU, at::kFloat) - b.to(at::kCPU, at::kFloat))
      .abs()
      .max()
      .item<double>();
}

at::Tensor Expected(const std::string& name) {
  return testing::GoldenTensor(name);
}

std::vector<int32_t> ToIds(const at::Tensor& t) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < t.numel(); ++i) ids.push_back(t[i].item<int64_t>());
  return ids;
}

std::unique_ptr<Qwen3Model> LoadGoldenTarget(const std::string& dir) {
  Qwen3Model::Options opts;
  opts.device = TestDevice();
  opts.feature_layer_ids = {0, 2};
  auto m = Qwen3Model::Load(dir, opts);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// Logits of every row of `tokens` run as one segment from an empty cache.
at::Tensor FullForward(Qwen3Model& m, SequenceId id,
                       const std::vector<int32_t>& tokens,
                       at::Tensor* features = nullptr) {
  EXPECT_TRUE(m.AddSequence(id).ok());
  TargetSegment seg{id, tokens, 0, {}};
  for (size_t i = 0; i < tokens.size(); ++i) seg.logit_rows.push_back(i);
  auto r = m.Forward({seg});
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(m.RemoveSequence(id).ok());
  if (features) *features = r->features;
  return r->logits;
}

TEST(Qwen3ModelTest, MatchesIndependentPythonReference) {
  auto m = LoadGoldenTarget(kGolden + "/target");
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->config().tie_word_embeddings);
  at::Tensor features;
  at::Tensor logits =
      FullForward(*m, 1, ToIds(Expected("input_ids")), &features);
  EXPECT_LT(MaxAbsDiff(logits, Expected("target_logits")), 1e-4);
  EXPECT_LT(MaxAbsDiff(features, Expected("target_features")), 1e-4);
}

TEST(Qwen3ModelTest, ShardedCheckpointLoadsIdentically) {
  auto archive = WeightArchive::OpenDirectory(kGolden + "/target");
  ASSERT_TRUE(archive.ok());
  std::vector<TensorToWrite> tensors;
  for (const std::string& name : (*archive)->TensorNames()) {
    TensorView v = *(*archive)->Get(name);
    tensors.push_back(
        {name, v.dtype, v.shape,
         std::string(reinterpret_cast<const char*>(v.data), v.nbytes)});
  }
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(WriteShardedSafetensors(dir, tensors, 200 * 1024).ok());
  std::filesystem::copy_file(kGolden + "/target/config.json",
                             dir + "/config.json");
  auto m = LoadGoldenTarget(dir);
  ASSERT_NE(m, nullptr);
  at::Tensor logits = FullForward(*m, 1, ToIds(Expected("input_ids")));
  EXPECT_LT(MaxAbsDiff(logits, Expected("target_logits")), 1e-4);
}

// Prefill, token-by-token decode, and a verify block that is partly rejected
// and rolled back must reproduce one full forward over the same tokens.
TEST(Qwen3ModelTest, IncrementalDecodeWithRollbackEqualsFullForward) {
  auto spec = DefaultTinySpec();
  auto pair = MakeTinyPair(spec, 11);
  Qwen3Model& m = *pair->target;
  const std::vector<int32_t> seq = RandomPrompt(90, spec.target.vocab_size, 5);
  at::Tensor full_features;
  at::Tensor full = FullForward(m, 100, seq, &full_features);

  ASSERT_TRUE(m.AddSequence(7).ok());
  std::vector<at::Tensor> rows, feats;
  auto run = [&](int64_t start, std::vector<int32_t> tokens, int keep) {
    TargetSegment s{7, tokens, start, {}};
    for (size_t i = 0; i < tokens.size(); ++i) s.logit_rows.push_back(i);
    auto r = m.Forward({s});
    ASSERT_TRUE(r.ok()) << r.status();
    rows.push_back(r->logits.narrow(0, 0, keep));
    feats.push_back(r->features.narrow(0, 0, keep));
  };
  // Prefill 30 (grows the cache past its initial 64 later), decode 10.
  run(0, std::vector<int32_t>(seq.begin(), seq.begin() + 30), 30);
  for (int i = 30; i < 40; ++i) run(i, {seq[i]}, 1);
  // Verify block: 3 right tokens then 5 wrong ones; keep 3, roll back.
  std::vector<int32_t> block(seq.begin() + 40, seq.begin() + 43);
  for (int j = 0; j < 5; ++j) block.push_back((seq[43 + j] + 1) % 128);
  run(40, block, 3);
  ASSERT_TRUE(m.Truncate(7, 43).ok());
  EXPECT_EQ(*m.Length(7), 43);
  // The rest as blocks of 16 (past the initial capacity of 64).
  for (int s = 43; s < 90; s += 16) {
    const int n = std::min(16, 90 - s);
    run(s, std::vector<int32_t>(seq.begin() + s, seq.begin() + s + n), n);
  }
  EXPECT_LT(MaxAbsDiff(at::cat(rows, 0), full), 1e-4);
  EXPECT_LT(MaxAbsDiff(at::cat(feats, 0), full_features), 1e-4);
}

TEST(Qwen3ModelTest, PackedBatchEqualsEachSequenceAlone) {
  auto spec = DefaultTinySpec();
  auto pair = MakeTinyPair(spec, 12);
  Qwen3Model& m = *pair->target;
  const std::vector<std::vector<int32_t>> prompts = {RandomPrompt(5, 128, 1),
                                                     RandomPrompt(17, 128, 2),
                                                     RandomPrompt(3, 128, 3)};
  std::vector<at::Tensor> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    alone.push_back(FullForward(m, 50 + i, prompts[i]));
  }
  // Prefill all three together.
  std::vector<TargetSegment> segs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(m.AddSequence(i + 1).ok());
    TargetSegment s{i + 1, prompts[i], 0, {}};
    for (size_t j = 0; j < prompts[i].size(); ++j) s.logit_rows.push_back(j);
    segs.push_back(s);
  }
  auto r = m.Forward(segs);
  ASSERT_TRUE(r.ok()) << r.status();
  for (size_t i = 0; i < prompts.size(); ++i) {
    at::Tensor got =
        r->logits.narrow(0, r->logit_offsets[i], prompts[i].size());
    EXPECT_LT(MaxAbsDiff(got, alone[i]), 1e-4) << "sequence " << i;
  }
  // A mixed step: sequence 1 decodes one token, 2 verifies a block of 4,
  // and a new sequence 4 prefills, all in one forward.
  const std::vector<int32_t> extra = RandomPrompt(4, 128, 9);
  ASSERT_TRUE(m.AddSequence(4).ok());
  auto mixed = m.Forward({{1, {extra[0]}, 5, {0}},
                          {2, extra, 17, {0, 1, 2, 3}},
                          {4, prompts[2], 0, {2}}});
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  std::vector<int32_t> p1 = prompts[0];
  p1.push_back(extra[0]);
  std::vector<int32_t> p2 = prompts[1];
  p2.insert(p2.end(), extra.begin(), extra.end());
  at::Tensor ref1 = FullForward(m, 60, p1);
  at::Tensor ref2 = FullForward(m, 61, p2);
  EXPECT_LT(MaxAbsDiff(mixed->logits.narrow(0, 0, 1), ref1.narrow(0, 5, 1)),
            1e-4);
  EXPECT_LT(MaxAbsDiff(mixed->logits.narrow(0, 1, 4), ref2.narrow(0, 17, 4)),
            1e-4);
  EXPECT_LT(MaxAbsDiff(mixed->logits.narrow(0, 5, 1), alone[2].narrow(0, 2, 1)),
            1e-4);
}

TEST(Qwen3ModelTest, BadSegmentsAreErrorsAndChangeNothing) {
  auto pair = MakeTinyPair(DefaultTinySpec(), 13);
  Qwen3Model& m = *pair->target;
  ASSERT_TRUE(m.AddSequence(1).ok());
  ASSERT_TRUE(m.Forward({{1, {1, 2, 3}, 0, {2}}}).ok());
  struct Case {
    std::vector<TargetSegment> segs;
    absl::StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {{{9, {1}, 0, {0}}}, absl::StatusCode::kNotFound, "unknown sequence"},
      {{{1, {1}, 2, {0}}}, absl::StatusCode::kInvalidArgument, "starts at 2"},
      {{{1, {500}, 3, {0}}}, absl::StatusCode::kInvalidArgument, "vocabulary"},
      {{{1, {-1}, 3, {0}}}, absl::StatusCode::kInvalidArgument, "vocabulary"},
      {{{1, {}, 3, {}}}, absl::StatusCode::kInvalidArgument, "empty"},
      {{{1, {4}, 3, {1}}}, absl::StatusCode::kInvalidArgument, "logit row"},
      {{{1, {4}, 3, {0}}, {1, {5}, 4, {0}}},
       absl::StatusCode::kInvalidArgument,
       "twice"},
  };
  for (const Case& c : cases) {
    auto r = m.Forward(c.segs);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
    EXPECT_EQ(*m.Length(1), 3);
  }
  EXPECT_EQ(m.Truncate(1, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.AddSequence(1).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(m.RemoveSequence(2).code(), absl::StatusCode::kNotFound);
  // Context limit.
  std::vector<int32_t> big(2049, 1);
  ASSERT_TRUE(m.AddSequence(3).ok());
  auto r = m.Forward({{3, big, 0, {0}}});
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("context limit"));
}

TEST(Qwen3ModelTest, MalformedCheckpointsAreErrors) {
  auto archive = WeightArchive::OpenDirectory(kGolden + "/target");
  ASSERT_TRUE(archive.ok());
  auto rewrite = [&](const std::string& drop, const std::string& reshape) {
    std::vector<TensorToWrite> tensors;
    for (const std::string& name : (*archive)->TensorNames()) {
      if (name == drop) continue;
      TensorView v = *(*archive)->Get(name);
      TensorToWrite t{
          name, v.dtype, v.shape,
          std::string(reinterpret_cast<const char*>(v.data), v.nbytes)};
      if (name == reshape) {
        t.shape = {v.shape[0] / 2, v.shape[1] * 2};
      }
      tensors.push_back(std::move(t));
    }
    const std::string dir = MakeTempDir();
    EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
    std::filesystem::copy_file(kGolden + "/target/config.json",
                               dir + "/config.json");
    return dir;
  };
  Qwen3Model::Options opts;
  auto missing = Qwen3Model::Load(
      rewrite("model.layers.2.self_attn.k_norm.weight", ""), opts);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("model.layers.2.self_attn.k_norm.weight"));
  auto no_head = Qwen3Model::Load(rewrite("lm_head.weight", ""), opts);
  EXPECT_THAT(std::string(no_head.status().message()), HasSubstr("lm_head"));
  auto shape =
      Qwen3Model::Load(rewrite("", "model.layers.0.mlp.up_proj.weight"), opts);
  ASSERT_FALSE(shape.ok());
  EXPECT_THAT(std::string(shape.status().message()),
              HasSubstr("model.layers.0.mlp.up_proj.weight"));
  opts.feature_layer_ids = {7};
  auto bad_layer = Qwen3Model::Load(kGolden + "/target", opts);
  EXPECT_EQ(bad_layer.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Qwen3ModelTest, Bfloat16ComputeTracksFloat32) {
  Qwen3Model::Options opts;
  opts.device = TestDevice();
  opts.dtype = at::kBFloat16;
  auto m = Qwen3Model::Load(kGolden + "/target", opts);
  ASSERT_TRUE(m.ok()) << m.status();
  at::Tensor logits = FullForward(**m, 1, ToIds(Expected("input_ids")));
  at::Tensor expected = Expected("target_logits");
  EXPECT_LT(MaxAbsDiff(logits, expected), 0.25);
  // Greedy choices mostly agree.
  const double agree = (logits.to(at::kCPU).argmax(-1) == expected.argmax(-1))
                           .to(at::kFloat)
                           .mean()
                           .item<double>();
  EXPECT_GE(agree, 0.8);
}

// The output head: the CPU's transposed copy gives the logits of
// x @ weight^T (the golden test above checks the whole model against an
// independent reference); on other devices no copy is made.
TEST(OutputHeadTest, LogitsAreTheProjectionOntoTheVocabulary) {
  at::manual_seed(3);
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const at::Tensor weight = at::randn({300, 24}).to(TestDevice(), dt);
    const OutputHead head = OutputHead::Pack(weight);
    EXPECT_EQ(head.weight_t.defined(), weight.device().is_cpu());
    for (int64_t rows : {1, 16}) {
      const at::Tensor x = at::randn({rows, 24}).to(TestDevice(), dt);
      const at::Tensor got = head.Logits(x);
      ASSERT_EQ(got.sizes(), (std::vector<int64_t>{rows, 300}));
      EXPECT_EQ(got.scalar_type(), dt);
      const double tol = dt == at::kFloat ? 1e-5 : 0.1;
      EXPECT_LT(MaxAbsDiff(got, at::linear(x, weight)), tol) << rows;
    }
  }
}

}  // namespace
}  // namespace dedit
