// The DEdit drafter: a DFlash-architecture block drafter that proposes a
// whole window in one pass (P1) and then edits its own proposal for K-1 more
// passes (P2..PK) with the same weights (docs/ARCHITECTURE.md §1 steps 2-4).
//
// Per sequence it keeps a context cache: for every committed token, each
// drafter layer's K/V of hidden_norm(fc(target features)). Context is never a
// query, and the block's own K/V is never written to the cache, so Draft()
// leaves the context length unchanged.
//
//   ASSIGN_OR_RETURN(auto drafter, DEditDrafter::Load(dir, embed, head, opts));
//   RETURN_IF_ERROR(drafter->AddSequence(7));
//   RETURN_IF_ERROR(drafter->AppendContext(7, 0, prompt_features));
//   ASSIGN_OR_RETURN(auto drafts,
//                    drafter->Draft({{.sequence = 7, .start = n, .bonus = t,
//                                     .window = 16, .passes = 3}}));
//
// Thread-compatible: one model thread owns the object.
#ifndef DEDIT_MODEL_DEDIT_DRAFTER_H_
#define DEDIT_MODEL_DEDIT_DRAFTER_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/model_config.h"
#include "common/base/safetensors.h"
#include "common/engine/draft.h"
#include "common/model/kv_pool.h"
#include "common/model/qwen3_model.h"
#include "common/model/transformer_ops.h"

namespace dedit {

class DEditDrafter {
 public:
  struct Options {
    c10::Device device = c10::Device(c10::kCPU);
    at::ScalarType dtype = at::kFloat;
    // Context pool (common/model/kv_pool.h): the longest context a sequence can
    // have (0 = the config's max_position_embeddings; set the target's),
    // the slabs allocated up front and the most sequences it may hold.
    int64_t max_context_tokens = 0;
    int initial_context_slots = 4;
    int max_sequences = 1 << 16;
  };

  // `embed_tokens` and `lm_head` are the target's ([vocab, hidden]); they are
  // shared, not copied, and must be on options.device in options.dtype.
  static absl::StatusOr<std::unique_ptr<DEditDrafter>> Load(
      const std::string& dir, at::Tensor embed_tokens, at::Tensor lm_head,
      const Options& options);
  static absl::StatusOr<std::unique_ptr<DEditDrafter>> FromArchive(
      const DrafterConfig& config, const WeightArchive& archive,
      at::Tensor embed_tokens, at::Tensor lm_head, const Options& options);

  const DrafterConfig& config() const { return config_; }
  int feature_width() const {
    return static_cast<int>(config_.target_layer_ids.size()) *
           config_.layers.hidden_size;
  }
  // The paper's causal ablation: P1 stays bidirectional (it is shared) and
  // the edit passes P2..PK attend causally inside the block. Defaults to the
  // checkpoint's dedit_config.
  void set_causal_editor(bool causal) { causal_editor_ = causal; }
  bool causal_editor() const { return causal_editor_; }

  absl::Status AddSequence(SequenceId id);
  absl::Status RemoveSequence(SequenceId id);
  // Moves a sequence's context out of the pool's slots into a copy of its
  // own tokens (KvPool::Park); its next append or draft brings it back.
  absl::Status ParkSequence(SequenceId id);
  // Context KV bytes held (slots and parked copies), and what the cached
  // tokens take.
  int64_t context_bytes() const;
  int64_t context_used_bytes() const;
  bool HasSequence(SequenceId id) const { return pool_->Contains(id); }
  absl::StatusOr<int64_t> ContextLength(SequenceId id) const;
  size_t num_sequences() const { return pool_->sequences(); }
  int64_t context_tokens() const;
  // The longest context a sequence may have.
  int64_t max_context_tokens() const;

  // Appends the context features ([n, feature_width], any dtype/device) of
  // committed tokens at positions start .. start + n - 1.
  // REQUIRES start == ContextLength(id).
  absl::Status AppendContext(SequenceId id, int64_t start,
                             const at::Tensor& features);
  // Context rows of one sequence, for AppendContexts.
  struct ContextChunk {
    SequenceId sequence = 0;
    int64_t start = 0;
    at::Tensor features;  // [n, feature_width], any dtype/device
  };
  // Appends several chunks, of one or many sequences, in one batched
  // projection per layer: a round's context costs one set of ops, not one
  // per chunk (a sequence gets a chunk per verify, and a drafter serving
  // 16 sequences gets 16 per round). Chunks of one sequence follow each
  // other: each starts where the sequence's context (with the chunks
  // before it in the list) ends. Every chunk is checked before any is
  // written, so a refused call changes nothing; the rows come out as
  // AppendContext's, chunk by chunk.
  absl::Status AppendContexts(const std::vector<ContextChunk>& chunks);
  // Whether `chunk` may extend its sequence's context once that holds
  // `cached` tokens: its start, its shape, the limit (the checks
  // AppendContexts makes, for a caller that queues chunks).
  absl::Status CheckContextChunk(const ContextChunk& chunk,
                                 int64_t cached) const;
  // Drops context at positions >= length (a session's next turn reuses a
  // prefix). REQUIRES length <= ContextLength(id).
  absl::Status TruncateContext(SequenceId id, int64_t length);

  // Runs P1..PK for every request, batched across sequences (requests may
  // differ in window and passes).
  absl::StatusOr<std::vector<DraftResult>> Draft(
      const std::vector<DraftRequest>& requests);

 private:
  DEditDrafter(const DrafterConfig& config, const Options& options)
      : config_(config),
        options_(options),
        causal_editor_(config.causal_editor) {}
  absl::Status ValidateRequests(
      const std::vector<DraftRequest>& requests) const;
  std::vector<DraftResult> RunDraft(const std::vector<DraftRequest>& requests);
  // Whether the context rows `f` (fp32, on the device) take the fused CPU
  // path of AppendContexts: an fp32 CPU drafter whose context products are
  // on panels and whose layers are packed (qk_norm).
  bool CpuContextApplies(const at::Tensor& f) const;
  // ctx = hidden_norm(fc(f)), then each layer's K (k_norm, RoPE) and V
  // written to `rows` of the pool, in a few loops over scratch rows
  // instead of ~12 ATen ops a layer (the context append is on every
  // speculative round's path). REQUIRES CpuContextApplies(f).
  void AppendContextRowsCpu(const at::Tensor& f,
                            const std::vector<int64_t>& positions,
                            const std::vector<int64_t>& rows);
  // One pass over the blocks of `active` requests, whose input ids (on the
  // device) are `ids`; returns the argmax and confidence of every head row
  // (slots 1..W-1 of each block, in order), on the device. `causal` masks
  // later block slots; `seeds` get the trust bonus (AddSeedBonus).
  struct SeedSlots {
    // The head rows the requests' seeds cover (in block and slot order),
    // their seed tokens, and for each the index into `rows` of its block's
    // first seeded row.
    const std::vector<int64_t>& rows;
    const std::vector<int64_t>& tokens;
    const std::vector<int64_t>& block_first;
  };
  std::pair<at::Tensor, at::Tensor> RunPass(
      const std::vector<DraftRequest>& requests,
      const std::vector<size_t>& active, const at::Tensor& ids,
      const std::vector<int64_t>& positions,
      const std::vector<int64_t>& head_rows, const SeedSlots& seeds,
      bool causal);
  // Trust in the seed (DrafterConfig::seed_logit_bonus): adds the bonus to
  // the seed token's logit at each seeded slot while the block follows its
  // seed, i.e. while every seeded slot before it in the block, given the
  // bonus, chooses the seed's token; from the first slot that does not, the
  // seed's later tokens continue a copy the draft has left, and the rest of
  // the block gets none. `logits`: [head rows, V] fp32, on the device.
  void AddSeedBonus(const SeedSlots& seeds, at::Tensor* logits) const;

  DrafterConfig config_;
  Options options_;
  bool causal_editor_;
  at::Tensor embed_tokens_;
  OutputHead head_;  // the target's lm_head, packed for the logits
  // fc and each layer's [k_proj; v_proj] for the context rows, as
  // OutputHead-style products (x @ W^T; a transposed copy and panels on
  // the CPU).
  OutputHead fc_;
  std::vector<OutputHead> context_kv_;
  at::Tensor hidden_norm_, final_norm_;
  std::vector<DecoderLayerWeights> layers_;
  Rotary rotary_;
  // Each slab holds the context's K/V, then the block's transient K/V
  // written past the context length by every pass.
  // Parked sequences among `ids` back into slots, before any slot index
  // is taken.
  absl::Status MakeResident(const std::vector<SequenceId>& ids);
  std::unique_ptr<KvPool> pool_;
};

// Context chunks waiting to be appended together with one
// DEditDrafter::AppendContexts call, and where each queued sequence's
// context will then end: the queue of the in-process LocalDrafter and of
// the drafter service's model thread.
class ContextQueue {
 public:
  // Where `id`'s context ends after its queued chunks; none if it has none.
  std::optional<int64_t> End(SequenceId id) const;
  // Queues `chunk` behind `chunk.sequence`'s others (checked by the caller:
  // DEditDrafter::CheckContextChunk).
  void Push(DEditDrafter::ContextChunk chunk);
  // Drops `id`'s queued chunks.
  void Drop(SequenceId id);
  size_t size() const { return chunks_.size(); }
  int64_t rows() const { return rows_; }
  // Appends every queued chunk in one call and empties the queue, whatever
  // the outcome; `sequences` (optional) gets the sequences that had chunks.
  absl::Status Flush(DEditDrafter& drafter,
                     std::vector<SequenceId>* sequences = nullptr);

 private:
  std::vector<DEditDrafter::ContextChunk> chunks_;
  std::unordered_map<SequenceId, int64_t> ends_;
  int64_t rows_ = 0;
};

}  // namespace dedit

#endif  // DEDIT_MODEL_DEDIT_DRAFTER_H_
