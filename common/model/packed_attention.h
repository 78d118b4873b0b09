// One attention call per decoder layer for a whole batch of segments, over
// the KV pool (common/model/kv_pool.h).
//
// A segment is a run of new tokens of one sequence: a prefill chunk or a
// verify block of the target, or a drafter block. Its queries are rows of a
// packed [n, heads, head_dim] tensor; its keys are its slab's positions
// [0, start + length) after WriteKv put the new tokens' K/V there. Queries
// are padded to [slots in range, max_q] and keys to max_k over one strided
// view of the pool (no gather, no copy of the cache), masked per segment:
//   causal:     query i sees keys j <= start + i (the target; the causal
//               editor's block);
//   not causal: query i sees every key j < start + length (the drafter's
//               bidirectional block over its context).
// The plan (indices and mask) is built once per forward on the host and
// moved to the device in one copy per tensor; every layer reuses it.
//
// Scores are computed in fp32 in query chunks, so one chunk's score tensor
// holds at most `max_score_elements` floats (default 64 Mi = 256 MiB); the
// peak is bounded whatever the context and prefill chunk.
//
// Segments of very different lengths (a prefill chunk beside decode steps)
// would pad every short one to the long one: segments are grouped by length
// so that padding at most doubles a group's queries, and each group is one
// call (one in steady-state decoding or verification).
//
// Under --cpu_products f32|bf16 (common/model/cpu/cpu_panels.h) an fp32 or bf16
// (--kv_cache_dtype bf16) CPU pool takes common/model/cpu/cpu_attention.h
// instead: one query row at a time, its output the same to the bit whatever the
// batch (what keeps bf16 speculation lossless).
//
// The matmul path builds on libtorch 1.13; GroupedAttention
// (common/model/transformer_ops.h) is the per-sequence reference it is tested
// against.
#ifndef DEDIT_MODEL_PACKED_ATTENTION_H_
#define DEDIT_MODEL_PACKED_ATTENTION_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/model/kv_pool.h"

namespace dedit {

struct AttentionSegment {
  int slot = 0;
  int64_t start = 0;   // keys [0, start) are already in the slab
  int64_t length = 0;  // new tokens at [start, start + length)
  bool causal = true;
};

class PackedAttention {
 public:
  // Segments in packed-row order; slots distinct. REQUIRES start + length
  // <= pool.slab_tokens() for each.
  PackedAttention(const std::vector<AttentionSegment>& segments,
                  const KvPool& pool, int num_heads,
                  int64_t max_score_elements = int64_t{64} << 20);

  // Writes the new tokens' k, v ([n, kv_heads, head_dim]) into their slabs.
  void WriteKv(KvPool* pool, int layer, const at::Tensor& k,
               const at::Tensor& v) const;
  // q: [n, heads, head_dim] packed, already scaled by 1/sqrt(head_dim)
  // (ProjectQkv folds the scale into the q norm) → [n, heads *
  // head_dim].
  at::Tensor Run(const at::Tensor& q, const KvPool& pool, int layer) const;

  // The CPU row kernel's path (common/model/cpu/cpu_attention.h): WriteKvRows
  // and RunRows take raw fp32 rows, with no ATen op (CpuDecoderLayer,
  // common/model/transformer_ops.h).
  bool cpu_rows() const { return cpu_rows_; }
  // WriteKv on raw rows: token t's kv head h at k + t * k_token_stride + h
  // * head_dim, and v alike. REQUIRES cpu_rows().
  void WriteKvRows(KvPool* pool, int layer, const float* k,
                   int64_t k_token_stride, const float* v,
                   int64_t v_token_stride) const;
  // Run on raw rows: q [n rows at q_row_stride, heads * head_dim adjacent],
  // out [n, heads * head_dim]. REQUIRES cpu_rows().
  void RunRows(const float* q, int64_t q_row_stride, const KvPool& pool,
               int layer, float* out) const;

  // Padded query rows over every group (what the scores are computed for).
  int64_t padded_queries() const;
  size_t num_groups() const { return groups_.size(); }

 private:
  // Segments run together: padded to [slots in range, max_q] queries and
  // max_k keys.
  struct Group {
    int64_t first_slot = 0, num_slots = 0, max_q = 0, max_k = 0;
    int64_t query_chunk = 0;
    at::Tensor q_index;    // [slots * max_q] packed row of each padded row
    at::Tensor out_index;  // [tokens] padded row of each of its tokens
    at::Tensor blocked;    // [slots, 1, 1, max_q, max_k] bool
    // No row blocks a key column before mask_from; blocked_tail is
    // blocked's columns [mask_from, max_k) (what the matmul path fills).
    int64_t mask_from = 0;
    at::Tensor blocked_tail;
    // Padded layout == packed layout (every slot in range has a segment of
    // max_q tokens, in slot and packed order, and this is the only group):
    // no gathers. Nothing blocked (one decode token over its whole slab):
    // no mask.
    bool identity_layout = false;
    bool any_blocked = true;
  };
  Group MakeGroup(const std::vector<AttentionSegment>& segments,
                  const std::vector<size_t>& members,
                  const std::vector<int64_t>& packed_offsets,
                  const KvPool& pool, int64_t max_score_elements) const;
  at::Tensor RunGroup(const Group& g, const at::Tensor& q, const KvPool& pool,
                      int layer) const;

  // The CPU's row-at-a-time kernel (common/model/cpu/cpu_attention.h), taken
  // under
  // --cpu_products f32|bf16 for an fp32 or bf16 CPU pool: each packed
  // row's slot and visible keys, and no groups.
  bool cpu_rows_ = false;
  std::vector<int64_t> kv_rows_;  // the flat pool rows (KvPool::WriteRows)
  std::vector<int32_t> row_slot_;
  std::vector<int64_t> row_visible_;

  int heads_;
  int kv_heads_;
  std::vector<Group> groups_;
  // The same flat rows on the device (KvPool::Write); not on cpu_rows_.
  at::Tensor kv_index_;
  // With several groups: the packed row of each row of the groups' outputs
  // concatenated, inverted (output row of each packed row).
  at::Tensor unpermute_;
};

}  // namespace dedit

#endif  // DEDIT_MODEL_PACKED_ATTENTION_H_
