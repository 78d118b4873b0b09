// Building blocks shared by the Qwen3 target, the DEdit drafter and the
// trainer: RMSNorm, rotary embedding, reference grouped-query attention, the
// SwiGLU MLP, Qwen3 decoder-layer weights and their packed inference path.
//
// Tensors here are "token-major": activations are [tokens, features], per-head
// tensors are [tokens, heads, head_dim]. Attention is written with plain
// matmul/softmax so that it builds on libtorch 1.13 (no public SDPA).
#ifndef DEDIT_MODEL_TRANSFORMER_OPS_H_
#define DEDIT_MODEL_TRANSFORMER_OPS_H_

#include <ATen/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/model_config.h"
#include "common/base/safetensors.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/packed_attention.h"

namespace dedit {

// RMSNorm as Qwen3 computes it: statistics in fp32, the normalised value cast
// back to x's dtype, then scaled by `weight`. Normalises the last dimension.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// t on `device`, with no op when it is there already (a forward's index
// tensors on the CPU).
inline at::Tensor OnDevice(const at::Tensor& t, c10::Device device) {
  return t.device() == device ? t : t.to(device);
}
// t in fp32, with no op when it is already.
inline at::Tensor AsFloat(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
}

// RMSNorm without the weight: x * rsqrt(mean(x^2) + eps), in 5 ops for fp32.
at::Tensor RmsNormalize(const at::Tensor& x, double eps);

// Rotary embedding (NeoX rotate-half) for head_dim `head_dim`.
class Rotary {
 public:
  Rotary() = default;
  // `dtype`: the dtype ApplyPacked runs in (its rotation matrix's).
  Rotary(int head_dim, double theta, c10::Device device,
         at::ScalarType dtype = at::kFloat);

  // cos/sin tables [n, head_dim] in `dtype` for absolute `positions` (int64).
  void Tables(const at::Tensor& positions, at::ScalarType dtype,
              at::Tensor* cos, at::Tensor* sin) const;
  // x: [n, heads, head_dim]; cos/sin: [n, head_dim].
  static at::Tensor Apply(const at::Tensor& x, const at::Tensor& cos,
                          const at::Tensor& sin);

  // The inference path: tables [n, 1, head_dim] made once per forward for
  // every layer, and RoPE in three ops, rotate-half as a matmul with a
  // signed permutation (exact: one non-zero term per output).
  void HeadTables(const at::Tensor& positions, at::ScalarType dtype,
                  at::Tensor* cos, at::Tensor* sin) const;
  // x: [n, heads, head_dim]; cos/sin from HeadTables.
  at::Tensor ApplyPacked(const at::Tensor& x, const at::Tensor& cos,
                         const at::Tensor& sin) const;

  // On the CPU in fp32: Tables for positions [0, min(n, kMaxCachedTables)),
  // made once by Tables itself, so that HeadTables copies its rows for
  // those positions instead of 11 ops a forward. The rows equal what
  // Tables gives for the same positions to the bit (ATen's vectorised
  // cos/sin take every element alike: a row is head_dim floats, whole
  // vectors); tests/model/cpu_kernels_test.cc checks it. Elsewhere
  // (CUDA, other dtypes, positions past the cache) HeadTables computes.
  static constexpr int64_t kMaxCachedTables = 32768;
  void CacheTables(int64_t n, at::ScalarType dtype);
  // Whether CacheTables made tables here (fp32, CPU).
  bool HasCachedTables() const { return cached_cos_.defined(); }
  // The cached rows of `positions` into cos and sin ([n, head_dim] fp32
  // each); a position past the cache is computed (Tables) for all rows.
  // REQUIRES HasCachedTables().
  void CachedRows(const std::vector<int64_t>& positions, float* cos,
                  float* sin) const;

 private:
  at::Tensor inv_freq_;     // [head_dim / 2], fp32
  at::Tensor rotate_half_;  // [head_dim, head_dim]: x @ R = rotate_half(x)
  at::Tensor cached_cos_, cached_sin_;  // [cached, head_dim], CacheTables
  // Whether every one of n positions has a cached row.
  bool AllCached(const int64_t* positions, int64_t n) const;
  // The cached rows of n positions into cos and sin. REQUIRES
  // AllCached(positions, n).
  void CopyCachedRows(const int64_t* positions, int64_t n, float* cos,
                      float* sin) const;
};

// Grouped-query attention for one sequence: the per-sequence reference
// that common/model/packed_attention.h (what the models run) is tested against.
//   q: [n_q, heads, head_dim]; k, v: [kv_heads, n_k, head_dim] (cache layout).
//   Query i may attend key j iff j <= causal_offset + i when causal_offset >= 0
//   (bottom-right aligned: the queries are the last n_q positions of a
//   sequence of length causal_offset + n_q). causal_offset < 0 → no mask.
//   `block_causal_from` >= 0 adds a causal mask among the keys from that index
//   on (the drafter's block) while keys before it stay fully visible.
// Returns [n_q, heads * head_dim]. Softmax is computed in fp32.
at::Tensor GroupedAttention(const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, int64_t causal_offset,
                            int64_t block_causal_from = -1);

// q: [n, heads, hd]; k, v: [n, kv_heads, hd].
struct QkvProjection {
  at::Tensor q, k, v;
};

// The output head: logits = x @ weight^T for a [vocab, hidden] `weight`
// (lm_head, or the tied embedding). OpenBLAS, the CPU build's BLAS,
// multiplies by the transpose of a [V, D] matrix several times slower than by
// the same matrix stored [D, V] (libtorch 1.13, one thread;
// docs/log/2026-12-06-bench-notebook.md, "The output head stored transposed on
// the CPU"). So on the CPU Pack keeps a transposed copy (1 MB for the tiny
// models). On CUDA cuBLAS reads either layout alike and a copy would double a
// large vocabulary's memory, so none is made there.
struct OutputHead {
  at::Tensor weight;    // [V, D]
  at::Tensor weight_t;  // [D, V], CPU only: contiguous for float weights,
                        // else weight's transposed view (CpuRightOperand)
  std::shared_ptr<const CpuPanels> panels;  // weight_t's, or null

  static OutputHead Pack(const at::Tensor& weight);
  // x: [n, D] -> [n, V] in x's dtype.
  at::Tensor Logits(const at::Tensor& x) const;
};

// Weights of one Qwen3 decoder layer ([out, in] linear weights).
struct DecoderLayerWeights {
  at::Tensor input_layernorm, post_attention_layernorm;
  at::Tensor q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
  at::Tensor gate_proj, up_proj, down_proj;
  // Packed at load for inference (PackDecoderLayer), each a transposed
  // [in, out] matrix for one mm/addmm: [q; k; v] with input_layernorm
  // folded in, o_proj, [gate; up] with post_attention_layernorm folded in,
  // down_proj; and the q and k norm weights per head ([heads + kv_heads,
  // head_dim]), the q rows scaled by 1/sqrt(head_dim) (the attention
  // scale, which commutes with RoPE). On the CPU the [in, out] matrices
  // of reduced-precision weights are transposed views of [out, in] rows,
  // on which libtorch's bf16 gemm sums in float (transformer_ops.cc,
  // CpuRightOperand).
  at::Tensor qkv_t, o_t, gate_up_t, down_t, qk_norm;
  // The same four packed for the process's --cpu_products kernel
  // (common/model/cpu/cpu_panels.h), or null (CUDA, bf16 tensors, "blas").
  std::shared_ptr<const CpuPanels> qkv_p, o_p, gate_up_p, down_p;
};

// Fills the packed weights of `w` from its separate ones. Folding the norm
// weights and the attention scale changes rounding only (<1e-5 relative in
// f32).
void PackDecoderLayer(const Qwen3Config& c, DecoderLayerWeights* w);

// A decoder layer's inference path over packed weights. ProjectQkv gives the
// attention inputs of tokens `x` ([n, hidden]): q = RoPE(q_norm(q_proj(h))),
// k = RoPE(k_norm(k_proj(h))), v = v_proj(h) with h = input_layernorm(x);
// FinishDecoderLayer the rest once attention ran (o_proj and its residual,
// then the post-attention-norm SwiGLU MLP and its residual). Few ops: one
// mm for q, k and v, one RMSNorm and one RoPE for q and k together, one mm
// for gate and up, the residual adds fused into addmm). q comes out
// pre-scaled by 1/sqrt(head_dim). cos/sin from Rotary::HeadTables.
QkvProjection ProjectQkv(const at::Tensor& x, const DecoderLayerWeights& w,
                         const Qwen3Config& c, const Rotary& rotary,
                         const at::Tensor& cos, const at::Tensor& sin);
at::Tensor FinishDecoderLayer(const at::Tensor& x, const at::Tensor& attn,
                              const DecoderLayerWeights& w,
                              const Qwen3Config& c);

// The same layer in one call on the CPU's own kernels (--cpu_products
// f32|bf16): RMSNorm, the qkv panel product, the q/k norm and RoPE, the
// K/V row write, the row attention, the o, gate/up and down panel
// products with their residuals, and SiLU x up, on raw rows in a scratch
// buffer of this thread; the only ATen op is the output's allocation (13
// ops a layer otherwise: a decode step was dispatch and allocation more
// than arithmetic). It runs the kernels ProjectQkv, PackedAttention and
// FinishDecoderLayer run on that path, in the same order, so its output
// and the K/V it writes equal theirs to the bit
// (CpuPanelsTest.FusedLayerEqualsTheOpByOpLayerToTheBit,
// tests/model/cpu_panels_test.cc). CpuDecoderLayerApplies says
// whether it takes the layer: an fp32 CPU x [n, hidden], the four products
// on panels, the attention on the CPU row path.
bool CpuDecoderLayerApplies(const at::Tensor& x, const DecoderLayerWeights& w,
                            const Qwen3Config& c, const at::Tensor& cos,
                            const at::Tensor& sin,
                            const PackedAttention& attention);
at::Tensor CpuDecoderLayer(const at::Tensor& x, const DecoderLayerWeights& w,
                           const Qwen3Config& c, const at::Tensor& cos,
                           const at::Tensor& sin,
                           const PackedAttention& attention, KvPool* pool,
                           int layer);

// One decoder layer of a forward: CpuDecoderLayer where it applies, else
// ProjectQkv, the attention's K/V write and run, and FinishDecoderLayer.
// What the target and the drafter run for each layer.
at::Tensor DecoderLayerForward(const at::Tensor& x,
                               const DecoderLayerWeights& w,
                               const Qwen3Config& c, const Rotary& rotary,
                               const at::Tensor& cos, const at::Tensor& sin,
                               const PackedAttention& attention, KvPool* pool,
                               int layer);

// down(silu(gate(x)) * up(x)).
at::Tensor SwiGluMlp(const at::Tensor& x, const DecoderLayerWeights& w);

// Per-head RMSNorm then RoPE on a projected [n, heads*hd] tensor; returns
// [n, heads, hd].
at::Tensor NormAndRotateHeads(const at::Tensor& projected, int heads,
                              int head_dim, const at::Tensor& norm_weight,
                              double eps, const at::Tensor& cos,
                              const at::Tensor& sin);

}  // namespace dedit

#endif  // DEDIT_MODEL_TRANSFORMER_OPS_H_
