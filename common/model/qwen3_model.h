// The Qwen3 dense target: weights, per-sequence KV caches, and one forward
// over a packed batch of segments.
//
// A segment is a run of new tokens of one sequence starting at that
// sequence's current cache length: a prefill chunk or a verify block. One
// Forward() runs all segments together — every projection and MLP over the
// concatenated tokens, attention per segment against its own cache — and
// returns logits only at the requested rows plus, optionally, the context
// features (outputs of decoder layers `feature_layer_ids`, concatenated) of
// every token.
//
//   ASSIGN_OR_RETURN(auto model, Qwen3Model::Load(dir, options));
//   RETURN_IF_ERROR(model->AddSequence(7));
//   ASSIGN_OR_RETURN(auto out, model->Forward({{7, prompt, 0, {last_row}}}));
//   ... model->Truncate(7, committed);
//
// Thread-compatible: one model thread owns the object.
#ifndef DEDIT_MODEL_QWEN3_MODEL_H_
#define DEDIT_MODEL_QWEN3_MODEL_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/model_config.h"
#include "common/base/safetensors.h"
#include "common/engine/draft.h"
#include "common/model/kv_pool.h"
#include "common/model/transformer_ops.h"

namespace dedit {

struct TargetSegment {
  SequenceId sequence = 0;
  std::vector<int32_t> tokens;
  // Absolute position of tokens[0]; must equal the sequence's cache length.
  int64_t start = 0;
  // Rows (indices into `tokens`) whose next-token logits are returned.
  std::vector<int> logit_rows;
};

struct TargetForwardResult {
  // [total logit rows, vocab] fp32, segment after segment.
  at::Tensor logits;
  std::vector<int64_t> logit_offsets;  // first row of each segment
  // The argmax of every logit row, computed on the device for the whole
  // batch and copied back once: what greedy verification reads.
  std::vector<int32_t> greedy;
  // [total tokens, n_ids * hidden] in the model dtype; undefined when the
  // model has no feature layers.
  at::Tensor features;
  std::vector<int64_t> token_offsets;  // first token row of each segment
};

class Qwen3Model {
 public:
  struct Options {
    c10::Device device = c10::Device(c10::kCPU);
    at::ScalarType dtype = at::kFloat;
    // Decoder layers whose outputs form the context features (may be empty).
    std::vector<int> feature_layer_ids;
    // KV pool: slabs allocated up front (it doubles when full) and the
    // most sequences it may hold (common/model/kv_pool.h).
    int initial_kv_slots = 4;
    int max_sequences = 1 << 16;
  };

  static absl::StatusOr<std::unique_ptr<Qwen3Model>> Load(
      const std::string& dir, const Options& options);
  static absl::StatusOr<std::unique_ptr<Qwen3Model>> FromArchive(
      const Qwen3Config& config, const WeightArchive& archive,
      const Options& options);

  const Qwen3Config& config() const { return config_; }
  const Options& options() const { return options_; }
  int feature_width() const {
    return static_cast<int>(options_.feature_layer_ids.size()) *
           config_.hidden_size;
  }

  absl::Status AddSequence(SequenceId id);
  absl::Status RemoveSequence(SequenceId id);
  bool HasSequence(SequenceId id) const { return pool_->Contains(id); }
  absl::StatusOr<int64_t> Length(SequenceId id) const;
  // Drops cached tokens at positions >= length. REQUIRES length <= Length().
  absl::Status Truncate(SequenceId id, int64_t length);
  size_t num_sequences() const { return pool_->sequences(); }
  // Moves a sequence kept between turns out of the KV pool's slots into a
  // copy of its own tokens (KvPool::Park); its next forward brings it
  // back. NOT_FOUND for an unknown id.
  absl::Status ParkSequence(SequenceId id);
  int64_t cached_tokens() const;     // sum of lengths over sequences
  int64_t cache_bytes() const;       // KV bytes held (slots and parked copies)
  int64_t cache_used_bytes() const;  // KV bytes of the cached tokens
  // Bytes of CPU weight panels (common/model/cpu/cpu_panels.h) one forward
  // reads: the decoder layers' products and the output head. 0 off the panels
  // path.
  int64_t panel_bytes() const;

  // Runs all segments; each sequence's cache grows by its segment length.
  // On error no cache length changes. Segments must name distinct sequences.
  absl::StatusOr<TargetForwardResult> Forward(
      const std::vector<TargetSegment>& segments);

  // Shared with the drafter (frozen in DFlash/DEdit): [vocab, hidden].
  const at::Tensor& embed_tokens() const { return embed_tokens_; }
  const at::Tensor& lm_head() const { return head_.weight; }

 private:
  Qwen3Model(const Qwen3Config& config, const Options& options)
      : config_(config), options_(options) {}
  absl::Status ValidateSegments(
      const std::vector<TargetSegment>& segments) const;
  TargetForwardResult RunForward(const std::vector<TargetSegment>& segments);

  Qwen3Config config_;
  Options options_;
  at::Tensor embed_tokens_, final_norm_;
  OutputHead head_;  // lm_head (or the tied embedding), packed
  std::vector<DecoderLayerWeights> layers_;
  Rotary rotary_;
  std::unique_ptr<KvPool> pool_;
};

// Loads only the target's embedding and lm_head (tied → the embedding), for a
// drafter service that runs without the target in its process.
absl::Status LoadTargetEmbeddings(const std::string& target_dir,
                                  at::ScalarType dtype, c10::Device device,
                                  at::Tensor* embed_tokens,
                                  at::Tensor* lm_head);

}  // namespace dedit

#endif  // DEDIT_MODEL_QWEN3_MODEL_H_
