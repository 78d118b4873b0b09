#include "common/model/packed_attention.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/model/cpu/cpu_attention.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/cpu/cpu_product_pool.h"

// libtorch >= 2.5 (the GPU build) has scaled_dot_product_attention with
// grouped-query heads; 1.13 (Debian, CPU) has no public SDPA.
#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
#define DEDIT_HAVE_SDPA 1
#else
#define DEDIT_HAVE_SDPA 0
#endif

namespace dedit {

PackedAttention::PackedAttention(const std::vector<AttentionSegment>& segments,
                                 const KvPool& pool, int num_heads,
                                 int64_t max_score_elements)
    : heads_(num_heads), kv_heads_(pool.shape().kv_heads) {
  if (segments.empty()) return;
  std::vector<int64_t> packed_offsets;
  std::vector<int64_t> kv_index;
  int64_t n = 0;
  for (const AttentionSegment& s : segments) {
    packed_offsets.push_back(n);
    pool.AppendRows(s.slot, s.start, s.length, &kv_index);
    n += s.length;
  }
  const at::Tensor& keys = pool.keys(0);
  const int64_t hd = pool.shape().head_dim;
  // An fp32 pool under --cpu_products f32|bf16; a bf16 row-kernel pool
  // always (its keys are in the kernel's blocks).
  const bool row_kernel =
      (keys.scalar_type() == at::kFloat && CpuAttentionRuns(hd) &&
       GetCpuProducts() != CpuProducts::kBlas) ||
      (keys.scalar_type() == at::kBFloat16 && pool.shape().bf16_row_kernel &&
       CpuAttentionBf16Runs(hd));
  TORCH_CHECK(row_kernel || !pool.shape().bf16_row_kernel,
              "PackedAttention: a bf16 row-kernel pool on a CPU without its "
              "kernel");
  if (row_kernel && keys.device().is_cpu() && keys.is_contiguous() &&
      pool.values(0).is_contiguous() && heads_ % kv_heads_ == 0) {
    cpu_rows_ = true;
    kv_rows_ = std::move(kv_index);
    for (const AttentionSegment& s : segments) {
      for (int64_t i = 0; i < s.length; ++i) {
        row_slot_.push_back(s.slot);
        row_visible_.push_back(s.causal ? s.start + i + 1 : s.start + s.length);
      }
    }
    return;
  }
  const c10::Device dev = keys.device();
  kv_index_ =
      at::tensor(kv_index, at::TensorOptions().dtype(at::kLong)).to(dev);
  // Groups by length, longest first: a segment joins the current group
  // while the group's padded queries stay within twice its real ones.
  std::vector<size_t> order(segments.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return segments[a].length > segments[b].length;
  });
  std::vector<std::vector<size_t>> members;
  int64_t group_max = 0, group_tokens = 0;
  for (size_t i : order) {
    const int64_t len = segments[i].length;
    if (members.empty() ||
        group_max * static_cast<int64_t>(members.back().size() + 1) >
            2 * (group_tokens + len)) {
      members.emplace_back();
      group_max = len;
      group_tokens = 0;
    }
    members.back().push_back(i);
    group_tokens += len;
  }
  for (std::vector<size_t>& m : members) {
    std::sort(m.begin(), m.end());  // packed order inside a group
    groups_.push_back(
        MakeGroup(segments, m, packed_offsets, pool, max_score_elements));
  }
  if (groups_.size() > 1) {
    for (Group& g : groups_) g.identity_layout = false;
    std::vector<int64_t> unpermute(n);
    int64_t row = 0;
    for (const std::vector<size_t>& m : members) {
      for (size_t i : m) {
        for (int64_t t = 0; t < segments[i].length; ++t) {
          unpermute[packed_offsets[i] + t] = row++;
        }
      }
    }
    unpermute_ =
        at::tensor(unpermute, at::TensorOptions().dtype(at::kLong)).to(dev);
  }
}

PackedAttention::Group PackedAttention::MakeGroup(
    const std::vector<AttentionSegment>& segments,
    const std::vector<size_t>& members,
    const std::vector<int64_t>& packed_offsets, const KvPool& pool,
    int64_t max_score_elements) const {
  Group g;
  int lo = segments[members[0]].slot, hi = lo;
  int64_t tokens = 0;
  for (size_t i : members) {
    const AttentionSegment& s = segments[i];
    lo = std::min(lo, s.slot);
    hi = std::max(hi, s.slot);
    g.max_q = std::max(g.max_q, s.length);
    g.max_k = std::max(g.max_k, s.start + s.length);
    tokens += s.length;
  }
  g.first_slot = lo;
  g.num_slots = hi - lo + 1;
  const int64_t rows = g.num_slots * g.max_q;
  // Padded rows read packed row 0 and see key 0 only: finite, discarded.
  std::vector<int64_t> q_index(rows, 0), out_index;
  out_index.reserve(tokens);
  std::vector<uint8_t> blocked(rows * g.max_k, 1);
  for (int64_t r = 0; r < rows; ++r) blocked[r * g.max_k] = 0;
  g.identity_layout = tokens == rows;
  int64_t expected_packed = 0;
  for (size_t m = 0; m < members.size(); ++m) {
    const AttentionSegment& s = segments[members[m]];
    const int64_t b = s.slot - g.first_slot;
    if (b != static_cast<int64_t>(m) ||
        packed_offsets[members[m]] != expected_packed) {
      g.identity_layout = false;
    }
    expected_packed += s.length;
    for (int64_t i = 0; i < s.length; ++i) {
      const int64_t row = b * g.max_q + i;
      q_index[row] = packed_offsets[members[m]] + i;
      out_index.push_back(row);
      const int64_t visible = s.causal ? s.start + i + 1 : s.start + s.length;
      std::fill(blocked.begin() + row * g.max_k,
                blocked.begin() + row * g.max_k + visible, 0);
    }
  }
  g.any_blocked = std::find(blocked.begin(), blocked.end(), 1) != blocked.end();
  // The first key column any row blocks: the columns before it are never
  // masked, so the matmul path fills only [mask_from, max_k). A verify or
  // prefill block blocks only the causal triangle over its own keys, not
  // the context's (a 16-token verify at 300 cached tokens: 15 columns of
  // 316, where a fill of the whole score tensor cost as much as the scores
  // product; docs/log/2026-12-06-bench-notebook.md, "The attention mask over
  // the block's own keys only").
  g.mask_from = g.max_k;
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = blocked.begin() + r * g.max_k;
    g.mask_from =
        std::min<int64_t>(g.mask_from, std::find(row, row + g.max_k, 1) - row);
  }
  const c10::Device dev = pool.keys(0).device();
  auto long_opts = at::TensorOptions().dtype(at::kLong);
  g.q_index = at::tensor(q_index, long_opts).to(dev);
  g.out_index = at::tensor(out_index, long_opts).to(dev);
  g.blocked = at::tensor(blocked, at::TensorOptions().dtype(at::kByte))
                  .to(dev, at::kBool)
                  .view({g.num_slots, 1, 1, g.max_q, g.max_k});
  g.blocked_tail = g.mask_from == 0
                       ? g.blocked
                       : g.blocked.narrow(4, g.mask_from, g.max_k - g.mask_from)
                             .contiguous();
  const int64_t per_query = g.num_slots * heads_ * g.max_k;
  g.query_chunk =
      std::clamp<int64_t>(max_score_elements / per_query, 1, g.max_q);
  return g;
}

int64_t PackedAttention::padded_queries() const {
  int64_t rows = 0;
  for (const Group& g : groups_) rows += g.num_slots * g.max_q;
  return rows;
}

void PackedAttention::WriteKv(KvPool* pool, int layer, const at::Tensor& k,
                              const at::Tensor& v) const {
  if (cpu_rows_) {
    // WriteRows copies whole heads: a head's elements must be adjacent.
    pool->WriteRows(layer, kv_rows_, k.stride(2) == 1 ? k : k.contiguous(),
                    v.stride(2) == 1 ? v : v.contiguous());
    return;
  }
  pool->Write(layer, kv_index_, k, v);
}

void PackedAttention::WriteKvRows(KvPool* pool, int layer, const float* k,
                                  int64_t k_token_stride, const float* v,
                                  int64_t v_token_stride) const {
  TORCH_CHECK(cpu_rows_, "PackedAttention::WriteKvRows: not the row path");
  const int64_t hd = pool->shape().head_dim;
  pool->WriteRows(layer, kv_rows_, k, k_token_stride, hd, v, v_token_stride,
                  hd);
}

void PackedAttention::RunRows(const float* q, int64_t q_row_stride,
                              const KvPool& pool, int layer, float* out) const {
  TORCH_CHECK(cpu_rows_, "PackedAttention::RunRows: not the row path");
  CpuAttentionRows rows;
  rows.n = static_cast<int64_t>(row_slot_.size());
  rows.slot = row_slot_.data();
  rows.visible = row_visible_.data();
  CpuProductPool* threads = CpuProductPool::ForRows(rows.n);
  if (pool.dtype() == at::kBFloat16) {
    TORCH_CHECK(pool.slab_tokens() % kBf16KeyBlock == 0,
                "PackedAttention: the bf16 kernel reads whole key blocks");
    CpuAttentionBf16(
        q, q_row_stride, rows, heads_, kv_heads_, pool.shape().head_dim,
        static_cast<const uint16_t*>(pool.keys(layer).data_ptr()),
        static_cast<const uint16_t*>(pool.values(layer).data_ptr()),
        pool.slab_tokens(), out, threads);
    return;
  }
  CpuAttention(q, q_row_stride, rows, heads_, kv_heads_, pool.shape().head_dim,
               pool.keys(layer).data_ptr<float>(),
               pool.values(layer).data_ptr<float>(), pool.slab_tokens(), out,
               threads);
}

at::Tensor PackedAttention::Run(const at::Tensor& q, const KvPool& pool,
                                int layer) const {
  if (cpu_rows_) {
    TORCH_CHECK(q.scalar_type() == at::kFloat && q.device().is_cpu(),
                "PackedAttention: the CPU row kernel needs fp32 CPU queries");
    TORCH_CHECK(q.size(0) == static_cast<int64_t>(row_slot_.size()),
                "PackedAttention: ", q.size(0), " query rows for ",
                row_slot_.size(), " packed rows");
    const at::Tensor qr =
        q.stride(2) == 1 && q.stride(1) == q.size(2) ? q : q.contiguous();
    at::Tensor out = at::empty({qr.size(0), heads_ * qr.size(2)}, qr.options());
    RunRows(qr.data_ptr<float>(), qr.stride(0), pool, layer,
            out.data_ptr<float>());
    return out;
  }
  if (groups_.size() == 1) return RunGroup(groups_[0], q, pool, layer);
  std::vector<at::Tensor> outs;
  for (const Group& g : groups_) outs.push_back(RunGroup(g, q, pool, layer));
  return at::cat(outs).index_select(0, unpermute_);
}

at::Tensor PackedAttention::RunGroup(const Group& g, const at::Tensor& q,
                                     const KvPool& pool, int layer) const {
  const int64_t n = q.size(0), hd = q.size(2);
  const int64_t group = heads_ / kv_heads_;
  const int64_t bk = g.num_slots * kv_heads_;
  const int64_t slab = pool.slab_tokens();
  // Views of the pool over the slots in range (slots are contiguous):
  // keys already transposed, [slots * kv, hd, max_k], and values
  // [slots * kv, max_k, hd].
  const int64_t offset = int64_t{g.first_slot} * kv_heads_ * slab * hd;
  at::Tensor keys_t = pool.keys(layer).as_strided({bk, hd, g.max_k},
                                                  {slab * hd, 1, hd}, offset);
  at::Tensor values = pool.values(layer).as_strided({bk, g.max_k, hd},
                                                    {slab * hd, hd, 1}, offset);
  // `blocked`: a query chunk of g.blocked_tail, the mask of the key
  // columns [mask_from, max_k).
  auto attend = [&](const at::Tensor& qs, const at::Tensor& blocked) {
    at::Tensor scores = at::bmm(qs, keys_t);  // [bk, rows, max_k]
    if (scores.scalar_type() != at::kFloat) scores = scores.to(at::kFloat);
    if (blocked.defined()) {
      scores.view({g.num_slots, kv_heads_, group, -1, g.max_k})
          .narrow(4, g.mask_from, g.max_k - g.mask_from)
          .masked_fill_(blocked, -std::numeric_limits<float>::infinity());
    }
    at::Tensor probs = at::softmax(scores, -1);
    if (probs.scalar_type() != values.scalar_type()) {
      probs = probs.to(values.scalar_type());
    }
    return at::bmm(probs, values);  // [bk, rows, hd]
  };
  if (g.identity_layout && g.max_q == 1) {
    // Decode: one query per slot, heads in kv-major order already.
    at::Tensor out = attend(q.reshape({bk, group, hd}),
                            g.any_blocked ? g.blocked_tail : at::Tensor());
    return out.view({n, heads_ * hd});
  }
  // [slots, max_q, kv, group, hd] → [slots, kv, group, max_q, hd]: query head
  // h uses kv head h / group.
  at::Tensor rows = q.reshape({n, heads_ * hd});
  if (!g.identity_layout) rows = rows.index_select(0, g.q_index);
#if DEDIT_HAVE_SDPA
  if (q.is_cuda()) {
    // Fused attention: no score tensor, so no query chunks. The mask is
    // "may attend" (the opposite of `blocked`); q is pre-scaled.
    at::Tensor q4 = rows.view({g.num_slots, g.max_q, heads_, hd})
                        .transpose(1, 2);  // [slots, heads, max_q, hd]
    at::Tensor k4 =
        keys_t.transpose(1, 2).view({g.num_slots, kv_heads_, g.max_k, hd});
    at::Tensor v4 = values.view({g.num_slots, kv_heads_, g.max_k, hd});
    at::Tensor keep = g.blocked.logical_not().squeeze(1);  // [slots,1,q,k]
    at::Tensor out = at::scaled_dot_product_attention(
        q4, k4, v4, keep, /*dropout_p=*/0.0, /*is_causal=*/false,
        /*scale=*/1.0, /*enable_gqa=*/true);
    out = out.transpose(1, 2).reshape({g.num_slots * g.max_q, heads_ * hd});
    return g.identity_layout ? out : out.index_select(0, g.out_index);
  }
#endif
  at::Tensor qp = rows.view({g.num_slots, g.max_q, kv_heads_, group, hd})
                      .permute({0, 2, 3, 1, 4});
  std::vector<at::Tensor> chunks;
  for (int64_t c0 = 0; c0 < g.max_q; c0 += g.query_chunk) {
    const int64_t qc = std::min(g.query_chunk, g.max_q - c0);
    at::Tensor qs = (qc == g.max_q ? qp : qp.narrow(3, c0, qc))
                        .reshape({bk, group * qc, hd});
    at::Tensor blocked;
    if (g.any_blocked) {
      blocked =
          qc == g.max_q ? g.blocked_tail : g.blocked_tail.narrow(3, c0, qc);
    }
    chunks.push_back(
        attend(qs, blocked).view({g.num_slots, kv_heads_, group, qc, hd}));
  }
  at::Tensor out = chunks.size() == 1 ? chunks[0] : at::cat(chunks, 3);
  out = out.permute({0, 3, 1, 2, 4})
            .reshape({g.num_slots * g.max_q, heads_ * hd});
  return g.identity_layout ? out : out.index_select(0, g.out_index);
}

}  // namespace dedit
