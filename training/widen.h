// Exact Net2Net widening of a Qwen3 target or a DFlash/DEdit drafter
// checkpoint: the wide model computes the same function as the original
// (up to the order of float sums) while its weights are F^2 times the
// bytes, so a trained tiny pair can stand in for a model whose decode is
// bound by reading its weights from memory (docs/RESULTS.md, "The
// production regime"). The algebra:
//
// The residual stream x of width H becomes x' = [x, x, ..., x] (F copies,
// block after block), width F*H:
//   - RMSNorm: rms(x') = rms(x), so a norm weight g becomes [g, ..., g].
//   - Every decoder-layer product W [out, in] becomes W.repeat(F, F) / F:
//     reading x' it sums F copies of W x / F, and its output is F copies of
//     W x. For q/k/v that stacks F copies of the heads in order, so q head
//     (copy j, head h) reads KV head (copy j, h / group); for gate/up it
//     makes F copies of the intermediate; o_proj and down_proj then write
//     F copies of their output back into the residual.
//   - q_norm and k_norm act per head_dim and RoPE per head: unchanged.
//   - The embedding (and an lm_head) becomes [E, ..., E] along hidden; the
//     head then reads E'·h' = F·E·h, so the final norm (the target's and
//     the drafter's, whose logits go through the target's head) is
//     [g, ..., g] / F and the logits stay equal.
//   - The drafter's fc reads the concatenation of its feature layers, each
//     now F copies: each feature's block of fc's columns is copied F times
//     and scaled by 1/F, and its rows copied F times.
// In bf16, W / F is exact when F is a power of two; any other F rounds
// each scaled weight once.
//
//   WidenOptions o{.from_dir = "checkpoints/tiny/target",
//                  .out_dir = "/tmp/wide/target", .factor = 8};
//   ASSIGN_OR_RETURN(WidenSummary s, WidenCheckpoint(o));
#ifndef DEDIT_TRAINING_WIDEN_H_
#define DEDIT_TRAINING_WIDEN_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dedit::training {

inline constexpr int kMaxWidenFactor = 64;

struct WidenOptions {
  // A model folder: config.json (architectures Qwen3ForCausalLM or
  // DFlashDraftModel) and its safetensors (one file or shards).
  std::string from_dir;
  // Gets config.json, model.safetensors (each tensor in its source dtype),
  // the tokenizer files the source has, and widening.json (what was done).
  // Created when missing; must not be from_dir.
  std::string out_dir;
  int factor = 8;  // 1..kMaxWidenFactor
};

enum class CheckpointKind { kTarget, kDrafter };

struct WidenSummary {
  CheckpointKind kind = CheckpointKind::kTarget;
  int factor = 1;
  // W / F is exact in the checkpoint's dtype (F a power of two).
  bool exact = true;
  int64_t hidden_size = 0;  // widened
  int64_t parameters = 0;   // of the written checkpoint
  int64_t weight_bytes = 0;
};

// Widens the checkpoint in options.from_dir by options.factor into
// options.out_dir. INVALID_ARGUMENT for a factor outside 1..kMaxWidenFactor,
// a config.json of another architecture, or out_dir == from_dir; NOT_FOUND
// for a missing folder, config.json or tensor; the source's layout is
// checked (shapes) before anything is written.
absl::StatusOr<WidenSummary> WidenCheckpoint(const WidenOptions& options);

// The kind named by `config_json`'s architectures.
absl::StatusOr<CheckpointKind> CheckpointKindOf(const std::string& config_json);

}  // namespace dedit::training

#endif  // DEDIT_TRAINING_WIDEN_H_
