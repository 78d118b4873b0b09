// Building blocks shared by the Qwen3 target and the DEdit drafter: RMSNorm,
// rotary embedding, grouped-query attention over a (possibly cached) key set,
// the SwiGLU MLP, and Qwen3 decoder-layer weights.
//
// Tensors here are "token-major": activations are [tokens, features], per-head
// tensors are [tokens, heads, head_dim]. Attention is written with plain
// matmul/softmax so that it builds on libtorch 1.13 (no public SDPA).
#ifndef DEDIT_MODEL_TRANSFORMER_OPS_H_
#define DEDIT_MODEL_TRANSFORMER_OPS_H_

#include <ATen/Tensor.h>

#include <string>

#include "absl/status/statusor.h"
#include "base/model_config.h"
#include "base/safetensors.h"

namespace dedit {

// RMSNorm as Qwen3 computes it: statistics in fp32, the normalised value cast
// back to x's dtype, then scaled by `weight`. Normalises the last dimension.
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Rotary embedding (NeoX rotate-half) for head_dim `head_dim`.
class Rotary {
 public:
  Rotary() = default;
  Rotary(int head_dim, double theta, c10::Device device);

  // cos/sin tables [n, head_dim] in `dtype` for absolute `positions` (int64).
  void Tables(const at::Tensor& positions, at::ScalarType dtype,
              at::Tensor* cos, at::Tensor* sin) const;
  // x: [n, heads, head_dim]; cos/sin: [n, head_dim].
  static at::Tensor Apply(const at::Tensor& x, const at::Tensor& cos,
                          const at::Tensor& sin);

 private:
  at::Tensor inv_freq_;  // [head_dim / 2], fp32
};

// Grouped-query attention for one sequence.
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

// Weights of one Qwen3 decoder layer ([out, in] linear weights).
struct DecoderLayerWeights {
  at::Tensor input_layernorm, post_attention_layernorm;
  at::Tensor q_proj, k_proj, v_proj, o_proj, q_norm, k_norm;
  at::Tensor gate_proj, up_proj, down_proj;
};

// down(silu(gate(x)) * up(x)).
at::Tensor SwiGluMlp(const at::Tensor& x, const DecoderLayerWeights& w);

// The attention inputs of one decoder layer for tokens `x` ([n, hidden]):
// h = input_layernorm(x); q = RoPE(q_norm(q_proj(h))), k = RoPE(k_norm(
// k_proj(h))), v = v_proj(h). q: [n, heads, hd]; k, v: [n, kv_heads, hd].
struct QkvProjection {
  at::Tensor q, k, v;
};
QkvProjection ProjectQkv(const at::Tensor& x, const DecoderLayerWeights& w,
                         const Qwen3Config& c, const at::Tensor& cos,
                         const at::Tensor& sin);

// The rest of a decoder layer once attention ran: residual through o_proj,
// then the post-attention-norm SwiGLU MLP with its residual.
at::Tensor FinishDecoderLayer(const at::Tensor& x, const at::Tensor& attn,
                              const DecoderLayerWeights& w,
                              const Qwen3Config& c);

// Per-head RMSNorm then RoPE on a projected [n, heads*hd] tensor; returns
// [n, heads, hd].
at::Tensor NormAndRotateHeads(const at::Tensor& projected, int heads,
                              int head_dim, const at::Tensor& norm_weight,
                              double eps, const at::Tensor& cos,
                              const at::Tensor& sin);

}  // namespace dedit

#endif  // DEDIT_MODEL_TRANSFORMER_OPS_H_
