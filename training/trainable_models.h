// Trainable (autograd) versions of the Qwen3 target and the DEdit drafter.
//
// The math is the engine's (common/model/qwen3_model.h,
// common/model/dedit_drafter.h, docs/ARCHITECTURE.md §1-2) re-batched for
// training: the target runs [B, T] windows with a causal mask; the drafter runs
// many blocks per sequence at once, each block seeing the context strictly
// before its anchor plus itself (bidirectionally, or causally for the
// ablation). The shared building blocks (RmsNorm, Rotary, NormAndRotateHeads,
// SwiGluMlp) are the engine's own functions, so a checkpoint exported here
// loads in the engine and gives the same logits up to float rounding
// (tests/training/ holds that).
//
//   ASSIGN_OR_RETURN(TrainableTarget target, TrainableTarget::Init(cfg, 1));
//   at::Tensor hidden = target.Forward(ids, {}, nullptr);   // [B, T, D]
//   at::Tensor loss = at::cross_entropy_loss(...target.Logits(hidden)...);
//   RETURN_IF_ERROR(target.Export(dir, at::kBFloat16, {}));
//
// Parameters are plain tensors with requires_grad set; the optimizer updates
// them in place, so the layer views stay valid.
#ifndef DEDIT_TRAINING_TRAINABLE_MODELS_H_
#define DEDIT_TRAINING_TRAINABLE_MODELS_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/checkpoint_layout.h"
#include "common/base/model_config.h"
#include "common/model/transformer_ops.h"

namespace dedit::training {

// One tensor of a model under its HF checkpoint name
// (common/base/checkpoint_layout.h).
struct NamedParameter {
  std::string name;
  at::Tensor value;
};

// The parameters of a model in checkpoint layout order
// (TargetCheckpointLayout / DrafterCheckpointLayout); the export and the
// optimizer state follow the same order and names.
using ParameterList = std::vector<NamedParameter>;

// Writes `params` (converted to `dtype`) as `<dir>/model.safetensors` plus
// `<dir>/config.json` = `config_json`, creating `dir`; every file is
// replaced atomically (common/base/file_util.h). Extra text files (e.g.
// tokenizer.json) are copied from `extra_files` (name -> contents).
// INVALID_ARGUMENT, before anything is written, unless `params` match
// `layout` (common/base/checkpoint_layout.h) name for name and shape for shape:
// an export is checked against the same table the engine's loader checks.
absl::Status ExportCheckpoint(
    const std::string& dir, const ParameterList& params,
    const std::vector<CheckpointTensor>& layout, at::ScalarType dtype,
    const std::string& config_json,
    const std::map<std::string, std::string>& extra_files);

class TrainableTarget {
 public:
  TrainableTarget() = default;

  // Fresh weights: linear layers N(0, 0.02) (output projections scaled by
  // 1/sqrt(2 L)), norms 1, from `seed`. fp32.
  static absl::StatusOr<TrainableTarget> Init(const Qwen3Config& config,
                                              uint64_t seed);
  // Weights of an HF folder, as fp32, trainable.
  static absl::StatusOr<TrainableTarget> Load(const std::string& dir);
  // `from` made deeper without changing what it computes (depth
  // up-scaling): its layers spread over `num_layers` (old layer i becomes
  // layer floor(i * num_layers / old layers)), and each new layer freshly
  // initialised from `seed` but with o_proj and down_proj zero, so that it
  // adds nothing to the residual stream until training moves them.
  static absl::StatusOr<TrainableTarget> Grow(const TrainableTarget& from,
                                              int num_layers, uint64_t seed);

  // ids: [B, T] int64 at positions 0..T-1. Returns the final-normed hidden
  // states [B, T, D]. When `features` is non-null it receives the outputs of
  // decoder layers `feature_layer_ids` concatenated, [B, T, n * D] (the
  // drafter's context features, docs/ARCHITECTURE.md §1 step 1).
  at::Tensor Forward(const at::Tensor& ids,
                     const std::vector<int>& feature_layer_ids,
                     at::Tensor* features) const;
  // Next-token logits (fp32) of final-normed hidden states.
  at::Tensor Logits(const at::Tensor& hidden) const;

  absl::Status Export(
      const std::string& dir, at::ScalarType dtype,
      const std::map<std::string, std::string>& extra_files) const;

  const Qwen3Config& config() const { return config_; }
  ParameterList& parameters() { return params_; }
  const ParameterList& parameters() const { return params_; }
  const at::Tensor& embed_tokens() const { return embed_tokens_; }
  const at::Tensor& lm_head() const { return lm_head_; }
  // Stops gradients into every parameter (the frozen target of drafter
  // training).
  void Freeze();

 private:
  // Builds the layer views over params_ (after Init/Load).
  absl::Status BindViews();

  Qwen3Config config_;
  ParameterList params_;
  at::Tensor embed_tokens_, lm_head_, final_norm_;
  std::vector<DecoderLayerWeights> layers_;
  Rotary rotary_;
};

// The drafter's per-layer keys/values of the projected context
// hidden_norm(fc(features)), for every position of every sequence.
struct DrafterContext {
  std::vector<at::Tensor> keys;    // per layer [S, kv_heads, T, head_dim]
  std::vector<at::Tensor> values;  // per layer [S, kv_heads, T, head_dim]
};

class TrainableDrafter {
 public:
  TrainableDrafter() = default;

  static absl::StatusOr<TrainableDrafter> Init(const DrafterConfig& config,
                                               uint64_t seed);
  static absl::StatusOr<TrainableDrafter> Load(const std::string& dir);
  // `from` made deeper without changing what it drafts, as
  // TrainableTarget::Grow: its layers spread over `num_layers`, each new
  // layer fresh from `seed` with o_proj and down_proj zero.
  static absl::StatusOr<TrainableDrafter> Grow(const TrainableDrafter& from,
                                               int num_layers, uint64_t seed);

  // features: [S, T, n_ids * D] (no gradient needed). Context position t
  // gets RoPE at absolute position t.
  DrafterContext ProjectContext(const at::Tensor& features) const;

  // Logits (fp32) of block slots 1..W-1, [S, NB, W-1, V].
  //   tokens:  [S, NB, W] int64, slot 0 = the anchor token (the bonus),
  //            slots 1.. = MASK (P1) or a proposal (edit passes);
  //   anchors: [S, NB] int64, the absolute position of slot 0. A block sees
  //            context positions < anchor, and its own slots (all of them,
  //            or slots <= its own when `causal`);
  //   embed_tokens / lm_head: the target's, [V, D], frozen.
  // When `block_share` is non-null it receives each query's attention mass
  // on the block's own keys (the rest is on the context), averaged over
  // heads and layers, [S, NB, W] fp32 without gradient (the editing
  // headroom's measure, `dedit-train headroom`); the logits are the same.
  at::Tensor BlockLogits(const DrafterContext& context,
                         const at::Tensor& tokens, const at::Tensor& anchors,
                         bool causal, const at::Tensor& embed_tokens,
                         const at::Tensor& lm_head,
                         at::Tensor* block_share = nullptr) const;

  absl::Status Export(
      const std::string& dir, at::ScalarType dtype,
      const std::map<std::string, std::string>& extra_files) const;

  const DrafterConfig& config() const { return config_; }
  DrafterConfig& mutable_config() { return config_; }
  ParameterList& parameters() { return params_; }
  const ParameterList& parameters() const { return params_; }

 private:
  absl::Status BindViews();

  DrafterConfig config_;
  ParameterList params_;
  at::Tensor fc_, hidden_norm_, final_norm_;
  std::vector<DecoderLayerWeights> layers_;
  Rotary rotary_;
};

// Trust in the seed (DrafterConfig::seed_logit_bonus), as the engine's
// DEditDrafter applies it: `logits` [..., W-1, V] of a block whose P1 input
// was `seeded_input` [..., W] (slot 0 the anchor, then the seed where it
// has one, MASK = `mask_id` after it) get + `bonus` at the seed's token at
// each seeded slot while the block follows its seed (every seeded slot
// before it chooses the seed's token with the bonus). The choice takes no
// gradient; the logits keep theirs. `bonus` 0 returns `logits`.
at::Tensor AddSeedTrust(const at::Tensor& logits,
                        const at::Tensor& seeded_input, int64_t mask_id,
                        double bonus);

}  // namespace dedit::training

#endif  // DEDIT_TRAINING_TRAINABLE_MODELS_H_
