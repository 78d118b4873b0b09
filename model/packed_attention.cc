#include "model/packed_attention.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace dedit {

PackedAttention::PackedAttention(const std::vector<AttentionSegment>& segments,
                                 const KvPool& pool, int num_heads,
                                 int64_t max_score_elements)
    : heads_(num_heads), kv_heads_(pool.shape().kv_heads) {
  if (segments.empty()) return;
  int lo = segments[0].slot, hi = segments[0].slot;
  int64_t n = 0;
  for (const AttentionSegment& s : segments) {
    lo = std::min(lo, s.slot);
    hi = std::max(hi, s.slot);
    max_q_ = std::max(max_q_, s.length);
    max_k_ = std::max(max_k_, s.start + s.length);
    n += s.length;
  }
  first_slot_ = lo;
  num_slots_ = hi - lo + 1;
  const int64_t rows = num_slots_ * max_q_;
  // Padded rows read packed row 0 and see key 0 only: finite, discarded.
  std::vector<int64_t> q_index(rows, 0), out_index(n), kv_index;
  kv_index.reserve(n * kv_heads_);
  std::vector<uint8_t> blocked(rows * max_k_, 1);
  for (int64_t r = 0; r < rows; ++r) blocked[r * max_k_] = 0;
  int64_t packed = 0;
  for (const AttentionSegment& s : segments) {
    const int64_t b = s.slot - first_slot_;
    for (int64_t i = 0; i < s.length; ++i, ++packed) {
      const int64_t row = b * max_q_ + i;
      q_index[row] = packed;
      out_index[packed] = row;
      const int64_t visible = s.causal ? s.start + i + 1 : s.start + s.length;
      std::fill(blocked.begin() + row * max_k_,
                blocked.begin() + row * max_k_ + max_k_, 1);
      std::fill(blocked.begin() + row * max_k_,
                blocked.begin() + row * max_k_ + visible, 0);
      for (int h = 0; h < kv_heads_; ++h) {
        kv_index.push_back(pool.FlatIndex(s.slot, h, s.start + i));
      }
    }
  }
  identity_layout_ = n == rows;
  for (size_t i = 0; identity_layout_ && i < segments.size(); ++i) {
    identity_layout_ = segments[i].slot == first_slot_ + static_cast<int>(i);
  }
  any_blocked_ = std::find(blocked.begin(), blocked.end(), 1) != blocked.end();
  const c10::Device dev = pool.keys(0).device();
  auto long_opts = at::TensorOptions().dtype(at::kLong);
  q_index_ = at::tensor(q_index, long_opts).to(dev);
  out_index_ = at::tensor(out_index, long_opts).to(dev);
  kv_index_ = at::tensor(kv_index, long_opts).to(dev);
  blocked_ = at::tensor(blocked, at::TensorOptions().dtype(at::kByte))
                 .to(dev, at::kBool)
                 .view({num_slots_, 1, 1, max_q_, max_k_});
  const int64_t per_query = num_slots_ * heads_ * max_k_;
  query_chunk_ = std::clamp<int64_t>(max_score_elements / per_query, 1, max_q_);
}

void PackedAttention::WriteKv(KvPool* pool, int layer, const at::Tensor& k,
                              const at::Tensor& v) const {
  pool->Write(layer, kv_index_, k, v);
}

at::Tensor PackedAttention::Run(const at::Tensor& q, const KvPool& pool,
                                int layer) const {
  const int64_t n = q.size(0), hd = q.size(2);
  const int64_t group = heads_ / kv_heads_;
  const int64_t bk = num_slots_ * kv_heads_;
  const int64_t slab = pool.slab_tokens();
  // Views of the pool over the slots in range (slots are contiguous):
  // keys already transposed, [slots * kv, hd, max_k], and values
  // [slots * kv, max_k, hd].
  const int64_t offset = int64_t{first_slot_} * kv_heads_ * slab * hd;
  at::Tensor keys_t =
      pool.keys(layer).as_strided({bk, hd, max_k_}, {slab * hd, 1, hd}, offset);
  at::Tensor values = pool.values(layer).as_strided({bk, max_k_, hd},
                                                    {slab * hd, hd, 1}, offset);
  auto attend = [&](const at::Tensor& qs, const at::Tensor& blocked) {
    at::Tensor scores = at::bmm(qs, keys_t);  // [bk, rows, max_k]
    if (scores.scalar_type() != at::kFloat) scores = scores.to(at::kFloat);
    if (blocked.defined()) {
      scores.view({num_slots_, kv_heads_, group, -1, max_k_})
          .masked_fill_(blocked, -std::numeric_limits<float>::infinity());
    }
    at::Tensor probs = at::softmax(scores, -1);
    if (probs.scalar_type() != values.scalar_type()) {
      probs = probs.to(values.scalar_type());
    }
    return at::bmm(probs, values);  // [bk, rows, hd]
  };
  if (identity_layout_ && max_q_ == 1) {
    // Decode: one query per slot, heads in kv-major order already.
    at::Tensor out = attend(q.reshape({bk, group, hd}),
                            any_blocked_ ? blocked_ : at::Tensor());
    return out.view({n, heads_ * hd});
  }
  // [slots, max_q, kv, group, hd] → [slots, kv, group, max_q, hd]: query head
  // h uses kv head h / group.
  at::Tensor rows = q.reshape({n, heads_ * hd});
  if (!identity_layout_) rows = rows.index_select(0, q_index_);
  at::Tensor qp = rows.view({num_slots_, max_q_, kv_heads_, group, hd})
                      .permute({0, 2, 3, 1, 4});
  std::vector<at::Tensor> chunks;
  for (int64_t c0 = 0; c0 < max_q_; c0 += query_chunk_) {
    const int64_t qc = std::min(query_chunk_, max_q_ - c0);
    at::Tensor qs = (qc == max_q_ ? qp : qp.narrow(3, c0, qc))
                        .reshape({bk, group * qc, hd});
    at::Tensor blocked;
    if (any_blocked_) {
      blocked = qc == max_q_ ? blocked_ : blocked_.narrow(3, c0, qc);
    }
    chunks.push_back(
        attend(qs, blocked).view({num_slots_, kv_heads_, group, qc, hd}));
  }
  at::Tensor out = chunks.size() == 1 ? chunks[0] : at::cat(chunks, 3);
  out =
      out.permute({0, 3, 1, 2, 4}).reshape({num_slots_ * max_q_, heads_ * hd});
  return identity_layout_ ? out : out.index_select(0, out_index_);
}

}  // namespace dedit
