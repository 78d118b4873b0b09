#include "common/model/transformer_ops.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/model/cpu/cpu_kernels.h"
#include "common/model/cpu/cpu_product_pool.h"
#include "common/model/tensor_io.h"

namespace dedit {

at::Tensor RmsNormalize(const at::Tensor& x, double eps) {
  if (CpuKernelsApply(x)) return CpuRmsNormalize(x, eps);
  if (x.scalar_type() == at::kFloat) {  // no casts
    return x * at::rsqrt(x.pow(2).mean({-1}, true) + eps);
  }
  at::Tensor xf = x.to(at::kFloat);
  return (xf * at::rsqrt(xf.pow(2).mean({-1}, true) + eps)).to(x.scalar_type());
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return RmsNormalize(x, eps) * weight;
}

Rotary::Rotary(int head_dim, double theta, c10::Device device,
               at::ScalarType dtype) {
  at::Tensor idx =
      at::arange(0, head_dim, 2, at::TensorOptions().dtype(at::kDouble));
  inv_freq_ = at::pow(theta, -(idx / head_dim)).to(at::kFloat).to(device);
  // rotate_half(x) = [-x2, x1]: output j < half takes -x[j + half], output
  // j >= half takes x[j - half].
  const int64_t half = head_dim / 2;
  at::Tensor r = at::zeros({head_dim, head_dim});
  for (int64_t j = 0; j < half; ++j) {
    r[j + half][j] = -1.0;
    r[j][j + half] = 1.0;
  }
  rotate_half_ = r.to(device, dtype);
}

void Rotary::CacheTables(int64_t n, at::ScalarType dtype) {
  n = std::min(n, kMaxCachedTables);
  if (n <= 0 || dtype != at::kFloat || !inv_freq_.device().is_cpu()) return;
  Tables(at::arange(n, at::TensorOptions().dtype(at::kLong)), dtype,
         &cached_cos_, &cached_sin_);
  cached_cos_ = cached_cos_.contiguous();
  cached_sin_ = cached_sin_.contiguous();
}

bool Rotary::AllCached(const int64_t* positions, int64_t n) const {
  if (!HasCachedTables()) return false;
  for (int64_t i = 0; i < n; ++i) {
    if (positions[i] < 0 || positions[i] >= cached_cos_.size(0)) return false;
  }
  return true;
}

void Rotary::CopyCachedRows(const int64_t* positions, int64_t n, float* cos,
                            float* sin) const {
  const int64_t hd = cached_cos_.size(1);
  const float* cc = cached_cos_.data_ptr<float>();
  const float* cs = cached_sin_.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(cos + i * hd, cc + positions[i] * hd, hd * sizeof(float));
    std::memcpy(sin + i * hd, cs + positions[i] * hd, hd * sizeof(float));
  }
}

void Rotary::CachedRows(const std::vector<int64_t>& positions, float* cos,
                        float* sin) const {
  TORCH_CHECK(HasCachedTables(), "Rotary::CachedRows: no cached tables");
  const int64_t n = static_cast<int64_t>(positions.size());
  if (AllCached(positions.data(), n)) {
    CopyCachedRows(positions.data(), n, cos, sin);
    return;
  }
  at::Tensor c, s;
  Tables(at::tensor(positions, at::TensorOptions().dtype(at::kLong)),
         at::kFloat, &c, &s);
  c = c.contiguous();
  s = s.contiguous();
  std::memcpy(cos, c.data_ptr<float>(), c.numel() * sizeof(float));
  std::memcpy(sin, s.data_ptr<float>(), s.numel() * sizeof(float));
}

void Rotary::HeadTables(const at::Tensor& positions, at::ScalarType dtype,
                        at::Tensor* cos, at::Tensor* sin) const {
  if (HasCachedTables() && dtype == at::kFloat && positions.device().is_cpu() &&
      positions.scalar_type() == at::kLong && positions.dim() == 1 &&
      positions.is_contiguous() &&
      AllCached(positions.data_ptr<int64_t>(), positions.numel())) {
    const int64_t n = positions.numel(), hd = cached_cos_.size(1);
    *cos = at::empty({n, 1, hd}, cached_cos_.options());
    *sin = at::empty({n, 1, hd}, cached_sin_.options());
    CopyCachedRows(positions.data_ptr<int64_t>(), n, cos->data_ptr<float>(),
                   sin->data_ptr<float>());
    return;
  }
  Tables(positions, dtype, cos, sin);
  *cos = cos->unsqueeze(1);
  *sin = sin->unsqueeze(1);
}

at::Tensor Rotary::ApplyPacked(const at::Tensor& x, const at::Tensor& cos,
                               const at::Tensor& sin) const {
  at::Tensor rotated =
      at::matmul(x, x.scalar_type() == rotate_half_.scalar_type()
                        ? rotate_half_
                        : rotate_half_.to(x.scalar_type()));
  return at::addcmul(x * cos, rotated, sin);
}

void Rotary::Tables(const at::Tensor& positions, at::ScalarType dtype,
                    at::Tensor* cos, at::Tensor* sin) const {
  at::Tensor freqs =
      positions.to(at::kFloat).unsqueeze(1) * inv_freq_.unsqueeze(0);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  *cos = emb.cos().to(dtype);
  *sin = emb.sin().to(dtype);
}

at::Tensor Rotary::Apply(const at::Tensor& x, const at::Tensor& cos,
                         const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half);
  at::Tensor x2 = x.narrow(-1, half, half);
  at::Tensor rotated = at::cat({-x2, x1}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

at::Tensor GroupedAttention(const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, int64_t causal_offset,
                            int64_t block_causal_from) {
  const int64_t n_q = q.size(0), heads = q.size(1), hd = q.size(2);
  const int64_t kv_heads = k.size(0), n_k = k.size(1);
  const int64_t group = heads / kv_heads;
  // [n_q, kv, group, hd] → [kv, group * n_q, hd]: query head h uses kv head
  // h / group, so each kv head serves a contiguous run of query heads and no
  // K/V copy is needed.
  at::Tensor qg = q.view({n_q, kv_heads, group, hd})
                      .permute({1, 2, 0, 3})
                      .reshape({kv_heads, group * n_q, hd});
  at::Tensor scores = at::bmm(qg, k.transpose(1, 2)).to(at::kFloat);
  scores.mul_(1.0 / std::sqrt(static_cast<double>(hd)));
  if (causal_offset >= 0 || block_causal_from >= 0) {
    auto opts = at::TensorOptions().dtype(at::kLong).device(q.device());
    at::Tensor qi = at::arange(n_q, opts).unsqueeze(1);
    at::Tensor kj = at::arange(n_k, opts).unsqueeze(0);
    at::Tensor blocked;
    if (causal_offset >= 0) {
      blocked = kj > (qi + causal_offset);
    } else {
      // Keys [0, block_causal_from) are context; block key b sits at
      // block_causal_from + b and is visible to query i iff b <= i.
      blocked = kj > (qi + block_causal_from);
    }
    scores = scores.view({kv_heads, group, n_q, n_k})
                 .masked_fill(blocked, -std::numeric_limits<float>::infinity())
                 .view({kv_heads, group * n_q, n_k});
  }
  at::Tensor probs = at::softmax(scores, -1).to(v.scalar_type());
  at::Tensor out = at::bmm(probs, v);  // [kv, group * n_q, hd]
  return out.view({kv_heads, group, n_q, hd})
      .permute({2, 0, 1, 3})
      .reshape({n_q, heads * hd});
}

at::Tensor SwiGluMlp(const at::Tensor& x, const DecoderLayerWeights& w) {
  at::Tensor gate = at::silu(at::linear(x, w.gate_proj));
  return at::linear(gate * at::linear(x, w.up_proj), w.down_proj);
}

at::Tensor NormAndRotateHeads(const at::Tensor& projected, int heads,
                              int head_dim, const at::Tensor& norm_weight,
                              double eps, const at::Tensor& cos,
                              const at::Tensor& sin) {
  at::Tensor x = projected.view({projected.size(0), heads, head_dim});
  return Rotary::Apply(RmsNorm(x, norm_weight, eps), cos, sin);
}

namespace {

// The [k, n] right operand of x @ w^T for a [n, k] CPU weight w. float
// weights: a contiguous transposed copy (what CpuPanels pack, and the
// layout of the column-block splits). Other dtypes: the transposed view
// of w's own [n, k] rows. libtorch 1.13's CPU gemm, where oneDNN has no
// bf16 kernel (AVX2-only CPUs, e.g. an AVX2 EPYC), sums a contiguous
// [k, n] operand's products into the bf16 output one at a time, and its
// error grows with k: 1.09 at k=128 against 0.12 for rounding once; on
// the transposed view it takes its dot-product path, which sums in float.
at::Tensor CpuRightOperand(const at::Tensor& w) {
  return w.scalar_type() == at::kFloat ? w.t().contiguous()
                                       : w.contiguous().t();
}

}  // namespace

OutputHead OutputHead::Pack(const at::Tensor& weight) {
  OutputHead h;
  h.weight = weight;
  if (weight.device().is_cpu()) {
    h.weight_t = CpuRightOperand(weight);
    h.panels = CpuPanels::PackForThisProcess(h.weight_t);
  }
  return h;
}

at::Tensor OutputHead::Logits(const at::Tensor& x) const {
  return weight_t.defined() ? CpuMm(x, weight_t, panels.get())
                            : at::linear(x, weight);
}

void PackDecoderLayer(const Qwen3Config& c, DecoderLayerWeights* w) {
  const at::ScalarType dt = w->q_proj.scalar_type();
  // [n, k] -> the [k, n] right operand of a product.
  auto right = [](const at::Tensor& nk) {
    return nk.device().is_cpu() ? CpuRightOperand(nk) : nk.t().contiguous();
  };
  // Folding is done in fp32, then cast once.
  auto fold = [&](const at::Tensor& proj, const at::Tensor& norm) {
    return right(
        (proj.to(at::kFloat) * norm.to(at::kFloat).unsqueeze(0)).to(dt));
  };
  at::Tensor qkv = at::cat({w->q_proj, w->k_proj, w->v_proj}, 0);
  w->qkv_t = fold(qkv, w->input_layernorm);
  w->o_t = right(w->o_proj);
  w->gate_up_t =
      fold(at::cat({w->gate_proj, w->up_proj}, 0), w->post_attention_layernorm);
  w->down_t = right(w->down_proj);
  w->qkv_p = CpuPanels::PackForThisProcess(w->qkv_t);
  w->o_p = CpuPanels::PackForThisProcess(w->o_t);
  w->gate_up_p = CpuPanels::PackForThisProcess(w->gate_up_t);
  w->down_p = CpuPanels::PackForThisProcess(w->down_t);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  w->qk_norm = at::cat({(w->q_norm.to(at::kFloat) * scale)
                            .unsqueeze(0)
                            .expand({c.num_attention_heads, c.head_dim}),
                        w->k_norm.to(at::kFloat)
                            .unsqueeze(0)
                            .expand({c.num_key_value_heads, c.head_dim})},
                       0)
                   .to(dt)
                   .contiguous();
}

QkvProjection ProjectQkv(const at::Tensor& x, const DecoderLayerWeights& w,
                         const Qwen3Config& c, const Rotary& rotary,
                         const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t n = x.size(0);
  const int64_t heads = c.num_attention_heads, kv = c.num_key_value_heads;
  const int64_t hd = c.head_dim;
  at::Tensor qkv =
      CpuMm(RmsNormalize(x, c.rms_norm_eps), w.qkv_t, w.qkv_p.get());
  at::Tensor qk;
  if (CpuKernelsApply(qkv) && CpuKernelsApply(w.qk_norm) &&
      CpuKernelsApply(cos) && CpuKernelsApply(sin)) {
    qk = CpuHeadNormRope(qkv, heads + kv, hd, w.qk_norm, c.rms_norm_eps, cos,
                         sin);
  } else {
    qk = qkv.narrow(1, 0, (heads + kv) * hd).view({n, heads + kv, hd});
    qk = rotary.ApplyPacked(RmsNorm(qk, w.qk_norm, c.rms_norm_eps), cos, sin);
  }
  QkvProjection p;
  p.q = qk.narrow(1, 0, heads);
  p.k = qk.narrow(1, heads, kv);
  p.v = qkv.narrow(1, (heads + kv) * hd, kv * hd).view({n, kv, hd});
  return p;
}

at::Tensor FinishDecoderLayer(const at::Tensor& x, const at::Tensor& attn,
                              const DecoderLayerWeights& w,
                              const Qwen3Config& c) {
  at::Tensor y = CpuAddmm(x, attn, w.o_t, w.o_p.get());
  const int64_t inter = w.gate_up_t.size(1) / 2;
  at::Tensor gu =
      CpuMm(RmsNormalize(y, c.rms_norm_eps), w.gate_up_t, w.gate_up_p.get());
  // On panels every row takes PanelSiluMul, whatever the rows: a verify
  // row must equal its decode step to the bit
  // (common/model/cpu/cpu_attention.h), and CpuSiluMul's scalar exp and ATen's
  // vectorised one round differently.
  if (w.gate_up_p != nullptr && CpuKernelsApply(gu)) {
    at::Tensor act = at::empty({gu.size(0), inter}, gu.options());
    PanelSiluMul(gu.data_ptr<float>(), gu.size(0), inter,
                 act.data_ptr<float>());
    return CpuAddmm(y, act, w.down_t, w.down_p.get());
  }
  at::Tensor act = CpuSiluMulPays(gu) ? CpuSiluMul(gu)
                                      : at::silu(gu.narrow(1, 0, inter)) *
                                            gu.narrow(1, inter, inter);
  return CpuAddmm(y, act, w.down_t, w.down_p.get());
}

bool CpuDecoderLayerApplies(const at::Tensor& x, const DecoderLayerWeights& w,
                            const Qwen3Config& c, const at::Tensor& cos,
                            const at::Tensor& sin,
                            const PackedAttention& attention) {
  const int64_t hd = c.head_dim;
  const int64_t qk_rows = c.num_attention_heads + c.num_key_value_heads;
  return attention.cpu_rows() && w.qkv_p != nullptr && w.o_p != nullptr &&
         w.gate_up_p != nullptr && w.down_p != nullptr && x.dim() == 2 &&
         CpuKernelsApply(x) && x.size(1) == c.hidden_size &&
         w.qkv_p->k() == c.hidden_size &&
         w.qkv_p->n() == (qk_rows + c.num_key_value_heads) * hd &&
         w.o_p->k() == c.num_attention_heads * hd &&
         w.o_p->n() == c.hidden_size && w.gate_up_p->k() == c.hidden_size &&
         w.gate_up_p->n() % 2 == 0 && w.down_p->k() == w.gate_up_p->n() / 2 &&
         w.down_p->n() == c.hidden_size && hd % 2 == 0 && hd <= 512 &&
         CpuKernelsApply(w.qk_norm) && w.qk_norm.numel() == qk_rows * hd &&
         CpuKernelsApply(cos) && CpuKernelsApply(sin) &&
         cos.numel() == x.size(0) * hd && sin.numel() == cos.numel();
}

namespace {

// CpuDecoderLayer once CpuDecoderLayerApplies said yes.
at::Tensor FusedDecoderLayer(const at::Tensor& x, const DecoderLayerWeights& w,
                             const Qwen3Config& c, const at::Tensor& cos,
                             const at::Tensor& sin,
                             const PackedAttention& attention, KvPool* pool,
                             int layer) {
  const int64_t n = x.size(0), hidden = c.hidden_size, hd = c.head_dim;
  const int64_t heads = c.num_attention_heads, kv = c.num_key_value_heads;
  const int64_t qkv_width = w.qkv_p->n(), inter = w.down_p->k();
  const int64_t qk_width = (heads + kv) * hd;
  // Scratch rows: normalised input (then normalised y), qkv, q/k after
  // norm and RoPE, attention output, y, gate/up, SiLU x up.
  thread_local std::vector<float> scratch;
  const int64_t need =
      n * (hidden + qkv_width + qk_width + heads * hd + hidden + 3 * inter);
  if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(need);
  float* normed = scratch.data();
  float* qkv = normed + n * hidden;
  float* qk = qkv + n * qkv_width;
  float* attn = qk + n * qk_width;
  float* y = attn + n * heads * hd;
  float* gu = y + n * hidden;
  float* act = gu + n * 2 * inter;
  CpuProductPool* products = CpuProductPool::ForThisThread();
  const float* xp = x.data_ptr<float>();
  CpuRmsNormalizeRows(xp, n, hidden, c.rms_norm_eps, normed);
  w.qkv_p->Multiply(normed, n, nullptr, qkv, products);
  CpuHeadNormRopeRows(qkv, n, qkv_width, heads + kv, hd,
                      w.qk_norm.data_ptr<float>(), c.rms_norm_eps,
                      cos.data_ptr<float>(), sin.data_ptr<float>(), qk);
  attention.WriteKvRows(pool, layer, qk + heads * hd, qk_width, qkv + qk_width,
                        qkv_width);
  attention.RunRows(qk, qk_width, *pool, layer, attn);
  w.o_p->Multiply(attn, n, xp, y, products);
  CpuRmsNormalizeRows(y, n, hidden, c.rms_norm_eps, normed);
  w.gate_up_p->Multiply(normed, n, nullptr, gu, products);
  PanelSiluMul(gu, n, inter, act);
  at::Tensor out = at::empty({n, hidden}, x.options());
  w.down_p->Multiply(act, n, y, out.data_ptr<float>(), products);
  return out;
}

}  // namespace

at::Tensor CpuDecoderLayer(const at::Tensor& x, const DecoderLayerWeights& w,
                           const Qwen3Config& c, const at::Tensor& cos,
                           const at::Tensor& sin,
                           const PackedAttention& attention, KvPool* pool,
                           int layer) {
  TORCH_CHECK(CpuDecoderLayerApplies(x, w, c, cos, sin, attention),
              "CpuDecoderLayer: the layer is not on the CPU kernels' path");
  return FusedDecoderLayer(x, w, c, cos, sin, attention, pool, layer);
}

at::Tensor DecoderLayerForward(const at::Tensor& x,
                               const DecoderLayerWeights& w,
                               const Qwen3Config& c, const Rotary& rotary,
                               const at::Tensor& cos, const at::Tensor& sin,
                               const PackedAttention& attention, KvPool* pool,
                               int layer) {
  if (CpuDecoderLayerApplies(x, w, c, cos, sin, attention)) {
    return FusedDecoderLayer(x, w, c, cos, sin, attention, pool, layer);
  }
  auto [q, k, v] = ProjectQkv(x, w, c, rotary, cos, sin);
  attention.WriteKv(pool, layer, k, v);
  return FinishDecoderLayer(x, attention.Run(q, *pool, layer), w, c);
}

}  // namespace dedit
