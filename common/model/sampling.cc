#include "common/model/sampling.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace dedit {

TokenSampler::TokenSampler(const SamplingParams& params) : params_(params) {
  if (params.has_seed) {
    rng_.seed(params.seed);
  } else {
    std::random_device rd;
    rng_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
  }
}

std::vector<int32_t> TokenSampler::Choose(const at::Tensor& logits) {
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
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* p = p_cpu.data_ptr<double>() + r * width;
    const int64_t* ix = i_cpu.data_ptr<int64_t>() + r * width;
    double mass = 0;
    for (int64_t j = 0; j < keep_n[r]; ++j) mass += p[j];
    double u = uniform(rng_) * mass;
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
