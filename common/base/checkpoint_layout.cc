#include "common/base/checkpoint_layout.h"

#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace dedit {
namespace {

DecoderLayerTensorNames LayerTensorNames(const std::string& prefix) {
  DecoderLayerTensorNames n;
  n.input_layernorm = prefix + "input_layernorm.weight";
  n.post_attention_layernorm = prefix + "post_attention_layernorm.weight";
  n.q_proj = prefix + "self_attn.q_proj.weight";
  n.k_proj = prefix + "self_attn.k_proj.weight";
  n.v_proj = prefix + "self_attn.v_proj.weight";
  n.o_proj = prefix + "self_attn.o_proj.weight";
  n.q_norm = prefix + "self_attn.q_norm.weight";
  n.k_norm = prefix + "self_attn.k_norm.weight";
  n.gate_proj = prefix + "mlp.gate_proj.weight";
  n.up_proj = prefix + "mlp.up_proj.weight";
  n.down_proj = prefix + "mlp.down_proj.weight";
  return n;
}

void Append(std::vector<CheckpointTensor> tensors,
            std::vector<CheckpointTensor>* layout) {
  for (CheckpointTensor& t : tensors) layout->push_back(std::move(t));
}

}  // namespace

DecoderLayerTensorNames TargetLayerTensorNames(int layer) {
  return LayerTensorNames(absl::StrCat("model.layers.", layer, "."));
}

DecoderLayerTensorNames DrafterLayerTensorNames(int layer) {
  return LayerTensorNames(absl::StrCat("layers.", layer, "."));
}

std::vector<CheckpointTensor> DecoderLayerLayout(
    const DecoderLayerTensorNames& n, const Qwen3Config& c) {
  const int64_t h = c.hidden_size, hd = c.head_dim, ff = c.intermediate_size;
  const int64_t q = int64_t{c.num_attention_heads} * hd;
  const int64_t kv = int64_t{c.num_key_value_heads} * hd;
  return {
      {n.input_layernorm, {h}, TensorRole::kNorm},
      {n.post_attention_layernorm, {h}, TensorRole::kNorm},
      {n.q_proj, {q, h}, TensorRole::kProjection},
      {n.k_proj, {kv, h}, TensorRole::kProjection},
      {n.v_proj, {kv, h}, TensorRole::kProjection},
      {n.o_proj, {h, q}, TensorRole::kResidualOutput},
      {n.q_norm, {hd}, TensorRole::kNorm},
      {n.k_norm, {hd}, TensorRole::kNorm},
      {n.gate_proj, {ff, h}, TensorRole::kProjection},
      {n.up_proj, {ff, h}, TensorRole::kProjection},
      {n.down_proj, {h, ff}, TensorRole::kResidualOutput},
  };
}

std::vector<CheckpointTensor> TargetCheckpointLayout(const Qwen3Config& c) {
  const int64_t v = c.vocab_size, h = c.hidden_size;
  std::vector<CheckpointTensor> layout;
  layout.push_back({kEmbedTokensWeight, {v, h}, TensorRole::kEmbedding});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Append(DecoderLayerLayout(TargetLayerTensorNames(l), c), &layout);
  }
  layout.push_back({kTargetNormWeight, {h}, TensorRole::kNorm});
  if (!c.tie_word_embeddings) {
    layout.push_back({kLmHeadWeight, {v, h}, TensorRole::kLmHead});
  }
  return layout;
}

std::vector<CheckpointTensor> TargetCheckpointLayout(
    const Qwen3Config& config, const WeightArchive& archive) {
  Qwen3Config stored = config;
  if (archive.Contains(kLmHeadWeight)) stored.tie_word_embeddings = false;
  return TargetCheckpointLayout(stored);
}

std::vector<CheckpointTensor> DrafterCheckpointLayout(const DrafterConfig& d) {
  const Qwen3Config& c = d.layers;
  const int64_t h = c.hidden_size;
  const int64_t features = static_cast<int64_t>(d.target_layer_ids.size()) * h;
  std::vector<CheckpointTensor> layout;
  layout.push_back({kDrafterFcWeight, {h, features}, TensorRole::kProjection});
  layout.push_back({kDrafterHiddenNormWeight, {h}, TensorRole::kNorm});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Append(DecoderLayerLayout(DrafterLayerTensorNames(l), c), &layout);
  }
  layout.push_back({kDrafterNormWeight, {h}, TensorRole::kNorm});
  return layout;
}

absl::Status CheckCheckpointLayout(
    const WeightArchive& archive, const std::vector<CheckpointTensor>& layout) {
  for (const CheckpointTensor& expected : layout) {
    absl::StatusOr<TensorView> view = archive.Get(expected.name);
    if (!view.ok()) return view.status();
    if (view->shape != expected.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", expected.name, "' has shape ", ShapeToString(view->shape),
          ", expected ", ShapeToString(expected.shape)));
    }
  }
  return absl::OkStatus();
}

}  // namespace dedit
