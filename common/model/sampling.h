// Token choice at the target (greedy or sampled) and the acceptance rule of
// docs/ARCHITECTURE.md §1 step 5.
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
#ifndef DEDIT_MODEL_SAMPLING_H_
#define DEDIT_MODEL_SAMPLING_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "common/engine/acceptance.h"
#include "common/engine/sampling_params.h"

namespace dedit {

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

}  // namespace dedit

#endif  // DEDIT_MODEL_SAMPLING_H_
