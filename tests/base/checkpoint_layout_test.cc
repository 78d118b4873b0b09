#include "common/base/checkpoint_layout.h"

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/model_config.h"
#include "common/base/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dedit {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// GQA with head_dim * heads != hidden, so that every [out, in] shape is
// distinguishable from its transpose and q from kv.
Qwen3Config SmallTarget() {
  Qwen3Config c;
  c.vocab_size = 50;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 6;
  c.tie_word_embeddings = true;
  return c;
}

DrafterConfig SmallDrafter() {
  DrafterConfig d;
  d.layers = SmallTarget();
  d.layers.num_hidden_layers = 2;
  d.target_layer_ids = {0, 1, 2};
  d.num_target_layers = 3;
  d.mask_token_id = 49;
  return d;
}

std::vector<std::string> Names(const std::vector<CheckpointTensor>& layout) {
  std::vector<std::string> names;
  for (const CheckpointTensor& t : layout) names.push_back(t.name);
  return names;
}

const CheckpointTensor* Find(const std::vector<CheckpointTensor>& layout,
                             const std::string& name) {
  for (const CheckpointTensor& t : layout) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// An in-memory archive holding F32 zeros of every tensor in `layout`.
class LayoutArchive {
 public:
  explicit LayoutArchive(const std::vector<CheckpointTensor>& layout) {
    for (const CheckpointTensor& t : layout) Add(t.name, t.shape);
  }
  void Add(const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    tensors_.push_back(
        {name, DType::kF32, shape, std::string(static_cast<size_t>(n) * 4, 0)});
  }
  void Remove(const std::string& name) {
    tensors_.erase(
        std::remove_if(tensors_.begin(), tensors_.end(),
                       [&](const TensorToWrite& t) { return t.name == name; }),
        tensors_.end());
  }
  void Reshape(const std::string& name, std::vector<int64_t> shape) {
    Remove(name);
    Add(name, std::move(shape));
  }
  // REQUIRES: called once; the archive points into this object.
  const WeightArchive& archive() {
    bytes_ = *SerializeSafetensors(tensors_);
    auto file = SafetensorsFile::Parse(
        reinterpret_cast<const uint8_t*>(bytes_.data()), bytes_.size(), "mem");
    EXPECT_TRUE(file.ok()) << file.status();
    std::vector<std::unique_ptr<SafetensorsFile>> files;
    files.push_back(*std::move(file));
    archive_ = *WeightArchive::FromFiles(std::move(files));
    return *archive_;
  }

 private:
  std::vector<TensorToWrite> tensors_;
  std::string bytes_;
  std::unique_ptr<WeightArchive> archive_;
};

TEST(CheckpointLayoutTest, LayerNames) {
  const DecoderLayerTensorNames t = TargetLayerTensorNames(3);
  EXPECT_EQ(t.input_layernorm, "model.layers.3.input_layernorm.weight");
  EXPECT_EQ(t.k_norm, "model.layers.3.self_attn.k_norm.weight");
  EXPECT_EQ(t.down_proj, "model.layers.3.mlp.down_proj.weight");
  const DecoderLayerTensorNames d = DrafterLayerTensorNames(0);
  EXPECT_EQ(d.q_proj, "layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(d.post_attention_layernorm,
            "layers.0.post_attention_layernorm.weight");
}

TEST(CheckpointLayoutTest, DecoderLayerShapesAndRoles) {
  const Qwen3Config c = SmallTarget();  // q = 24, kv = 12, H = 16, F = 24
  const std::vector<CheckpointTensor> layer =
      DecoderLayerLayout(TargetLayerTensorNames(0), c);
  ASSERT_EQ(layer.size(), 11u);
  const std::string p = "model.layers.0.";
  EXPECT_THAT(
      Names(layer),
      ElementsAre(p + "input_layernorm.weight",
                  p + "post_attention_layernorm.weight",
                  p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                  p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight",
                  p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight",
                  p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                  p + "mlp.down_proj.weight"));
  EXPECT_THAT(layer[0].shape, ElementsAre(16));
  EXPECT_THAT(layer[2].shape, ElementsAre(24, 16));   // q_proj [q, H]
  EXPECT_THAT(layer[3].shape, ElementsAre(12, 16));   // k_proj [kv, H]
  EXPECT_THAT(layer[5].shape, ElementsAre(16, 24));   // o_proj [H, q]
  EXPECT_THAT(layer[6].shape, ElementsAre(6));        // q_norm [head_dim]
  EXPECT_THAT(layer[8].shape, ElementsAre(24, 16));   // gate_proj [F, H]
  EXPECT_THAT(layer[10].shape, ElementsAre(16, 24));  // down_proj [H, F]
  EXPECT_EQ(layer[0].role, TensorRole::kNorm);
  EXPECT_EQ(layer[2].role, TensorRole::kProjection);
  EXPECT_EQ(layer[5].role, TensorRole::kResidualOutput);
  EXPECT_EQ(layer[10].role, TensorRole::kResidualOutput);
}

TEST(CheckpointLayoutTest, TargetTiedAndUntied) {
  Qwen3Config c = SmallTarget();
  std::vector<CheckpointTensor> tied = TargetCheckpointLayout(c);
  ASSERT_EQ(tied.size(), 1u + 3 * 11 + 1);
  EXPECT_EQ(tied.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(tied.front().role, TensorRole::kEmbedding);
  EXPECT_THAT(tied.front().shape, ElementsAre(50, 16));
  EXPECT_EQ(tied.back().name, "model.norm.weight");
  EXPECT_EQ(Find(tied, "lm_head.weight"), nullptr);
  EXPECT_NE(Find(tied, "model.layers.2.mlp.up_proj.weight"), nullptr);
  EXPECT_EQ(Find(tied, "model.layers.3.mlp.up_proj.weight"), nullptr);

  c.tie_word_embeddings = false;
  std::vector<CheckpointTensor> untied = TargetCheckpointLayout(c);
  ASSERT_EQ(untied.size(), tied.size() + 1);
  EXPECT_EQ(untied.back().name, "lm_head.weight");
  EXPECT_EQ(untied.back().role, TensorRole::kLmHead);
  EXPECT_THAT(untied.back().shape, ElementsAre(50, 16));

  const std::vector<std::string> names = Names(untied);
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(),
            names.size());
}

TEST(CheckpointLayoutTest, TiedConfigWithAStoredHeadListsIt) {
  Qwen3Config c = SmallTarget();
  c.tie_word_embeddings = false;
  LayoutArchive with_head(TargetCheckpointLayout(c));
  c.tie_word_embeddings = true;
  const std::vector<CheckpointTensor> layout =
      TargetCheckpointLayout(c, with_head.archive());
  EXPECT_EQ(layout.back().name, "lm_head.weight");

  LayoutArchive without_head(TargetCheckpointLayout(c));
  EXPECT_EQ(
      Find(TargetCheckpointLayout(c, without_head.archive()), "lm_head.weight"),
      nullptr);
}

TEST(CheckpointLayoutTest, Drafter) {
  const DrafterConfig d = SmallDrafter();
  const std::vector<CheckpointTensor> layout = DrafterCheckpointLayout(d);
  ASSERT_EQ(layout.size(), 2u + 2 * 11 + 1);
  EXPECT_EQ(layout[0].name, "fc.weight");
  EXPECT_THAT(layout[0].shape, ElementsAre(16, 3 * 16));  // [H, n_ids * H]
  EXPECT_EQ(layout[1].name, "hidden_norm.weight");
  EXPECT_EQ(layout[2].name, "layers.0.input_layernorm.weight");
  EXPECT_EQ(layout.back().name, "norm.weight");
  // The embedding and head are the target's.
  for (const CheckpointTensor& t : layout) {
    EXPECT_NE(t.role, TensorRole::kEmbedding) << t.name;
    EXPECT_NE(t.role, TensorRole::kLmHead) << t.name;
    EXPECT_EQ(t.name.rfind("model.", 0), std::string::npos) << t.name;
  }
}

TEST(CheckCheckpointLayoutTest, AcceptsAMatchingArchiveWithExtras) {
  const std::vector<CheckpointTensor> layout =
      TargetCheckpointLayout(SmallTarget());
  LayoutArchive archive(layout);
  archive.Add("model.layers.0.self_attn.rotary_emb.inv_freq", {3});
  EXPECT_TRUE(CheckCheckpointLayout(archive.archive(), layout).ok());
}

TEST(CheckCheckpointLayoutTest, MissingTensorIsNotFoundNamingIt) {
  const std::vector<CheckpointTensor> layout =
      DrafterCheckpointLayout(SmallDrafter());
  LayoutArchive archive(layout);
  archive.Remove("layers.1.self_attn.k_norm.weight");
  const absl::Status status = CheckCheckpointLayout(archive.archive(), layout);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(),
              HasSubstr("'layers.1.self_attn.k_norm.weight'"));
}

TEST(CheckCheckpointLayoutTest, WrongShapeNamesTensorAndBothShapes) {
  const std::vector<CheckpointTensor> layout =
      TargetCheckpointLayout(SmallTarget());
  LayoutArchive archive(layout);
  archive.Reshape("model.layers.1.self_attn.o_proj.weight", {24, 16});
  const absl::Status status = CheckCheckpointLayout(archive.archive(), layout);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "tensor 'model.layers.1.self_attn.o_proj.weight' has shape "
            "[24, 16], expected [16, 24]");
}

// The table against real checkpoints: the bundled pair written by
// dedit-train, and the golden pair written by the independent Python
// reference (tests/golden/make_golden.py; untied, head_dim * heads != H).
// Every tensor in them is in the layout and vice versa.
void ExpectLayoutIsExactly(const std::string& dir, bool drafter) {
  SCOPED_TRACE(dir);
  auto archive = WeightArchive::OpenDirectory(dir);
  ASSERT_TRUE(archive.ok()) << archive.status();
  std::vector<CheckpointTensor> layout;
  if (drafter) {
    auto config = LoadDrafterConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    layout = DrafterCheckpointLayout(*config);
  } else {
    auto config = LoadQwen3Config(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    layout = TargetCheckpointLayout(*config, **archive);
  }
  EXPECT_TRUE(CheckCheckpointLayout(**archive, layout).ok());
  std::vector<std::string> names = Names(layout);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (*archive)->TensorNames());
}

TEST(CheckpointLayoutTest, MatchesBundledAndGoldenCheckpoints) {
  const std::string root = DEDIT_SOURCE_DIR;
  ExpectLayoutIsExactly(root + "/checkpoints/tiny/target", false);
  ExpectLayoutIsExactly(root + "/checkpoints/tiny/drafter", true);
  ExpectLayoutIsExactly(root + "/tests/testdata/golden/target", false);
  ExpectLayoutIsExactly(root + "/tests/testdata/golden/drafter", true);
}

}  // namespace
}  // namespace dedit
