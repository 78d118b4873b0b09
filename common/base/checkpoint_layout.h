// The checkpoint tensor layout (docs/ARCHITECTURE.md §6): every tensor of a
// Qwen3 target and of a DFlash/DEdit drafter checkpoint, with its name, its
// shape under a given config and its role. This is the one place those names
// and shapes are spelled out; the engine's loaders
// (common/model/qwen3_model.cc, common/model/dedit_drafter.cc), the
// random-model writer (common/model/tiny_model.cc) and the trainer
// (training/trainable_models.cc) all walk these tables.
//
// Why base/ and not model/: the table is plain data computed from the config
// structs (common/base/model_config.h), shapes are int64 vectors, and the check
// against a checkpoint needs only WeightArchive's shape views
// (common/base/safetensors.h). Nothing here needs libtorch, so it sits next to
// the parsers it describes, is tested with them under ASan+UBSan, and a
// torch-free tool can validate a checkpoint without loading a weight. The
// libtorch half (loading a layout into tensors) is
// common/model/checkpoint_weights.h.
//
//   ASSIGN_OR_RETURN(Qwen3Config config, LoadQwen3Config(dir));
//   ASSIGN_OR_RETURN(auto archive, WeightArchive::OpenDirectory(dir));
//   const auto layout = TargetCheckpointLayout(config, *archive);
//   RETURN_IF_ERROR(CheckCheckpointLayout(*archive, layout));
//   for (const CheckpointTensor& t : layout) { ... t.name, t.shape ... }
#ifndef DEDIT_BASE_CHECKPOINT_LAYOUT_H_
#define DEDIT_BASE_CHECKPOINT_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/model_config.h"
#include "common/base/safetensors.h"

namespace dedit {

// What a tensor is for; writers choose initialisations by role.
enum class TensorRole {
  kEmbedding,  // token embedding, [vocab, hidden]
  kLmHead,     // output head, [vocab, hidden]
  kNorm,       // RMSNorm scale, [n]
  // Linear weight [out, in] whose output feeds attention or the MLP inside a
  // block: q/k/v_proj, gate/up_proj, and the drafter's fc.
  kProjection,
  // Linear weight [out, in] whose output is added to the residual stream:
  // o_proj, down_proj (scaled down with depth by GPT-2-style inits).
  kResidualOutput,
};

// One tensor of a checkpoint. Linear weights are [out, in] (HF convention).
struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> shape;
  TensorRole role = TensorRole::kProjection;
};

// Top-level tensor names.
inline constexpr char kEmbedTokensWeight[] = "model.embed_tokens.weight";
inline constexpr char kTargetNormWeight[] = "model.norm.weight";
inline constexpr char kLmHeadWeight[] = "lm_head.weight";
inline constexpr char kDrafterFcWeight[] = "fc.weight";
inline constexpr char kDrafterHiddenNormWeight[] = "hidden_norm.weight";
inline constexpr char kDrafterNormWeight[] = "norm.weight";

// The full names of one decoder layer's tensors.
struct DecoderLayerTensorNames {
  std::string input_layernorm, post_attention_layernorm;
  std::string q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
  std::string gate_proj, up_proj, down_proj;
};

// Decoder layer `layer` (0-based) of the target: `model.layers.{layer}.*`.
DecoderLayerTensorNames TargetLayerTensorNames(int layer);
// Decoder layer `layer` of the drafter: `layers.{layer}.*` (no `model.`).
DecoderLayerTensorNames DrafterLayerTensorNames(int layer);

// The 11 tensors of one Qwen3 decoder layer shaped by `config`, in the order
// input_layernorm, post_attention_layernorm, q/k/v/o_proj, q/k_norm,
// gate/up/down_proj.
std::vector<CheckpointTensor> DecoderLayerLayout(
    const DecoderLayerTensorNames& names, const Qwen3Config& config);

// Every tensor of a target checkpoint, in writing order: embed_tokens, each
// layer's DecoderLayerLayout, model.norm, then lm_head.weight when the config
// is untied. (The order is part of the contract: the random writers draw
// weights in it, so reordering changes every seeded model.)
std::vector<CheckpointTensor> TargetCheckpointLayout(const Qwen3Config& config);

// The target layout of the checkpoint in `archive`: as above, and
// lm_head.weight also when the config is tied but the archive carries one
// anyway (the engine then uses it as the head; the trainer trains it
// untied). Only which tensors exist is read, not their shapes.
std::vector<CheckpointTensor> TargetCheckpointLayout(
    const Qwen3Config& config, const WeightArchive& archive);

// Every tensor of a drafter checkpoint, in writing order: fc
// [hidden, n_ids * hidden], hidden_norm, each layer's DecoderLayerLayout,
// norm. The drafter has no embedding or head: it shares the target's.
std::vector<CheckpointTensor> DrafterCheckpointLayout(
    const DrafterConfig& config);

// OK when `archive` holds every tensor of `layout` with exactly its shape;
// otherwise the first failure in layout order: NOT_FOUND naming the missing
// tensor, or INVALID_ARGUMENT naming the tensor, its shape and the expected
// one. Tensors the layout does not list are ignored (HF checkpoints may carry
// extras such as rotary buffers).
absl::Status CheckCheckpointLayout(const WeightArchive& archive,
                                   const std::vector<CheckpointTensor>& layout);

}  // namespace dedit

#endif  // DEDIT_BASE_CHECKPOINT_LAYOUT_H_
