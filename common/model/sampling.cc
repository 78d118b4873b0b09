#include "common/model/sampling.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"

namespace dedit {

std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter,
                                   std::array<uint32_t, 2> key) {
  // The round multipliers and the key's Weyl increments (golden ratio and
  // sqrt(3) - 1) of the paper, section 4.
  constexpr uint64_t kMul0 = 0xD2511F53, kMul1 = 0xCD9E8D57;
  constexpr uint32_t kWeyl0 = 0x9E3779B9, kWeyl1 = 0xBB67AE85;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = kMul0 * counter[0], p1 = kMul1 * counter[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32);
    const uint32_t lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32);
    const uint32_t lo1 = static_cast<uint32_t>(p1);
    counter = {hi1 ^ counter[1] ^ key[0], lo1, hi0 ^ counter[3] ^ key[1], lo0};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return counter;
}

double PhiloxUniform(uint64_t seed, int64_t position) {
  const uint64_t p = static_cast<uint64_t>(position);
  const std::array<uint32_t, 4> r = Philox4x32(
      {static_cast<uint32_t>(p), static_cast<uint32_t>(p >> 32), 0, 0},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  // 27 + 26 random bits over 2^53: every double in [0, 1) on that grid.
  const uint64_t bits = (static_cast<uint64_t>(r[0] >> 5) << 26) | (r[1] >> 6);
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}

TokenSampler::TokenSampler(const SamplingParams& params) : params_(params) {
  if (params.has_seed) {
    seed_ = params.seed;
  } else {
    std::random_device rd;
    seed_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
}

std::vector<int32_t> TokenSampler::Choose(const at::Tensor& logits,
                                          int64_t first_position) const {
  const int64_t rows = logits.size(0);
  std::vector<int32_t> out(rows);
  if (greedy()) {
    at::Tensor idx = logits.argmax(-1).to(at::kCPU, at::kInt).contiguous();
    std::copy(idx.data_ptr<int32_t>(), idx.data_ptr<int32_t>() + rows,
              out.begin());
    return out;
  }
  at::Tensor scaled = logits.to(at::kFloat) / params_.temperature;
  const int64_t vocab = scaled.size(1);
  at::Tensor values, indices;
  if (params_.top_k > 0 && params_.top_k < vocab) {
    std::tie(values, indices) = scaled.topk(params_.top_k, -1);  // sorted
  } else if (params_.top_p < 1.0f) {
    std::tie(values, indices) = scaled.sort(-1, /*descending=*/true);
  } else {
    // Plain sampling needs no order: skip the vocabulary-wide sort.
    values = scaled;
    indices = at::arange(vocab, scaled.options().dtype(at::kLong))
                  .unsqueeze(0)
                  .expand({rows, vocab});
  }
  at::Tensor probs = at::softmax(values, -1);
  // Candidates to keep per row: everything before the cumulative mass reaches
  // top_p, plus the token that crosses it. Only that prefix leaves the
  // device.
  at::Tensor keep;
  if (params_.top_p < 1.0f) {
    at::Tensor before = probs.cumsum(-1) - probs;
    keep = (before < params_.top_p).sum(-1).clamp_min(1);
  } else {
    keep =
        at::full({rows}, probs.size(1), at::TensorOptions().dtype(at::kLong));
  }
  keep = keep.to(at::kCPU, at::kLong).contiguous();
  const int64_t* keep_n = keep.data_ptr<int64_t>();
  const int64_t width = *std::max_element(keep_n, keep_n + rows);
  at::Tensor p_cpu =
      probs.narrow(1, 0, width).to(at::kCPU, at::kDouble).contiguous();
  at::Tensor i_cpu =
      indices.narrow(1, 0, width).to(at::kCPU, at::kLong).contiguous();
  for (int64_t r = 0; r < rows; ++r) {
    const double* p = p_cpu.data_ptr<double>() + r * width;
    const int64_t* ix = i_cpu.data_ptr<int64_t>() + r * width;
    double mass = 0;
    for (int64_t j = 0; j < keep_n[r]; ++j) mass += p[j];
    double u = PhiloxUniform(seed_, first_position + r) * mass;
    int64_t pick = keep_n[r] - 1;  // guards against rounding at the tail
    for (int64_t j = 0; j < keep_n[r]; ++j) {
      u -= p[j];
      if (u < 0) {
        pick = j;
        break;
      }
    }
    out[r] = static_cast<int32_t>(ix[pick]);
  }
  return out;
}

}  // namespace dedit
