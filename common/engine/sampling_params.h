// Per-request sampling settings, as the round logic and the wire carry them.
// Choosing tokens with them (TokenSampler) is the verifier's job and lives
// with the model code (common/model/sampling.h); this header is torch-free so
// that the router can validate requests without a model.
//
//   SamplingParams p{.temperature = 0.7f, .top_p = 0.9f};
//   RETURN_IF_ERROR(ValidateSamplingParams(p));
#ifndef DEDIT_ENGINE_SAMPLING_PARAMS_H_
#define DEDIT_ENGINE_SAMPLING_PARAMS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace dedit {

struct SamplingParams {
  float temperature = 0.0f;  // 0 → greedy (argmax)
  int top_k = 0;             // 0 → no top-k
  float top_p = 1.0f;        // 1 → no nucleus truncation
  uint64_t seed = 0;
  bool has_seed = false;  // false → seeded from std::random_device
};

// INVALID_ARGUMENT for negative/non-finite temperature, negative top_k, or
// top_p outside (0, 1].
absl::Status ValidateSamplingParams(const SamplingParams& params);

}  // namespace dedit

#endif  // DEDIT_ENGINE_SAMPLING_PARAMS_H_
