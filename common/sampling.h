// Token choice at the target (greedy or sampled) and the acceptance rule of
// DESIGN.md §1 step 5.
//
// Sampling follows the usual order: temperature, then top-k, then top-p
// (nucleus, keeping the smallest prefix whose mass reaches top_p), then one
// draw from a per-request generator. With a seed the choices are
// reproducible; the draft is accepted iff it equals the target's own sample,
// so the output distribution is exactly the target's.
//
//   TokenSampler sampler(params);
//   std::vector<int32_t> choices = sampler.Choose(logits);  // one per row
//   int acc = AcceptedPrefixLength(draft, choices);
#ifndef DEDIT_COMMON_SAMPLING_H_
#define DEDIT_COMMON_SAMPLING_H_

#include <cstdint>
#include <random>
#include <vector>

#include <ATen/Tensor.h>

#include "absl/status/status.h"

namespace dedit {

struct SamplingParams {
  float temperature = 0.0f;  // 0 → greedy (argmax)
  int top_k = 0;             // 0 → no top-k
  float top_p = 1.0f;        // 1 → no nucleus truncation
  uint64_t seed = 0;
  bool has_seed = false;     // false → seeded from std::random_device
};

// INVALID_ARGUMENT for negative/non-finite temperature, negative top_k, or
// top_p outside (0, 1].
absl::Status ValidateSamplingParams(const SamplingParams& params);

class TokenSampler {
 public:
  explicit TokenSampler(const SamplingParams& params);

  bool greedy() const { return params_.temperature == 0.0f; }
  // logits: [rows, vocab] float, any device. Returns the choice per row.
  std::vector<int32_t> Choose(const at::Tensor& logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

// Length of the longest prefix of `draft` (block slots 1..) that equals the
// target's choices at the preceding slots: draft[i] is accepted iff
// draft[0..i] all equal target_choices[0..i].
int AcceptedPrefixLength(const std::vector<int32_t>& draft,
                         const std::vector<int32_t>& target_choices);

}  // namespace dedit

#endif  // DEDIT_COMMON_SAMPLING_H_
