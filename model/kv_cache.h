// Per-sequence key/value storage for a stack of attention layers.
//
// Each layer holds K and V as [kv_heads, capacity, head_dim]. Capacity grows
// geometrically (x2), so appending a token is amortised O(1) and decoding
// never reallocates per token. Truncate() only moves the length: rollback
// after a rejected draft costs nothing.
//
// Not thread-safe: a cache belongs to the model thread that owns it.
#ifndef DEDIT_MODEL_KV_CACHE_H_
#define DEDIT_MODEL_KV_CACHE_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace dedit {

class KvCache {
 public:
  KvCache(int num_layers, int kv_heads, int head_dim, at::ScalarType dtype,
          c10::Device device, int64_t initial_capacity = 64);

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }

  // Ensures room for `total` tokens, growing all layers at once.
  void Reserve(int64_t total);
  // Writes k, v ([n, kv_heads, head_dim]) of `layer` at [start, start + n).
  // REQUIRES: start <= length(), Reserve(start + n) done.
  void Write(int layer, int64_t start, const at::Tensor& k,
             const at::Tensor& v);
  // Sets the number of valid tokens (after the writes of a forward step, or
  // to roll back).
  void SetLength(int64_t length) { length_ = length; }
  // Views of the first `n` tokens: [kv_heads, n, head_dim].
  at::Tensor Keys(int layer, int64_t n) const;
  at::Tensor Values(int layer, int64_t n) const;
  // Bytes held on the device.
  int64_t nbytes() const;

 private:
  int kv_heads_, head_dim_;
  at::ScalarType dtype_;
  c10::Device device_;
  int64_t length_ = 0;
  int64_t capacity_ = 0;
  std::vector<at::Tensor> k_, v_;
};

}  // namespace dedit

#endif  // DEDIT_MODEL_KV_CACHE_H_
