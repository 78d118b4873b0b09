#include "model/kv_cache.h"

#include <ATen/Functions.h>

#include <algorithm>

namespace dedit {

KvCache::KvCache(int num_layers, int kv_heads, int head_dim,
                 at::ScalarType dtype, c10::Device device,
                 int64_t initial_capacity)
    : kv_heads_(kv_heads),
      head_dim_(head_dim),
      dtype_(dtype),
      device_(device),
      k_(num_layers),
      v_(num_layers) {
  Reserve(std::max<int64_t>(initial_capacity, 1));
}

void KvCache::Reserve(int64_t total) {
  if (total <= capacity_) return;
  const int64_t new_capacity = std::max(total, capacity_ * 2);
  auto opts = at::TensorOptions().dtype(dtype_).device(device_);
  for (size_t l = 0; l < k_.size(); ++l) {
    at::Tensor k = at::empty({kv_heads_, new_capacity, head_dim_}, opts);
    at::Tensor v = at::empty({kv_heads_, new_capacity, head_dim_}, opts);
    if (length_ > 0) {
      k.narrow(1, 0, length_).copy_(k_[l].narrow(1, 0, length_));
      v.narrow(1, 0, length_).copy_(v_[l].narrow(1, 0, length_));
    }
    k_[l] = std::move(k);
    v_[l] = std::move(v);
  }
  capacity_ = new_capacity;
}

void KvCache::Write(int layer, int64_t start, const at::Tensor& k,
                    const at::Tensor& v) {
  const int64_t n = k.size(0);
  k_[layer].narrow(1, start, n).copy_(k.transpose(0, 1));
  v_[layer].narrow(1, start, n).copy_(v.transpose(0, 1));
}

at::Tensor KvCache::Keys(int layer, int64_t n) const {
  return k_[layer].narrow(1, 0, n);
}

at::Tensor KvCache::Values(int layer, int64_t n) const {
  return v_[layer].narrow(1, 0, n);
}

int64_t KvCache::nbytes() const {
  int64_t total = 0;
  for (size_t l = 0; l < k_.size(); ++l)
    total += k_[l].nbytes() + v_[l].nbytes();
  return total;
}

}  // namespace dedit
