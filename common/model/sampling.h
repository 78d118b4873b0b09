// Token choice at the target (greedy or sampled) and the acceptance rule of
// docs/ARCHITECTURE.md §1 step 5.
//
// Sampling follows the usual order: temperature, then top-k, then top-p
// (nucleus, keeping the smallest prefix whose mass reaches top_p), then one
// draw. The draw for the token at absolute position p of a sequence is a
// pure function of (seed, p): a counter-based generator (Philox4x32-10,
// Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC 2011),
// not a stream whose state depends on how many draws came before. So a
// seeded request gives the same tokens whatever its rounds verified (a
// rejected draft's rows draw nothing away from later positions), and a
// stream moved to another target mid-way (router/stack_set.h), re-prefilled
// with its prompt and every token it had, continues exactly as it would
// have. The draft is accepted iff it equals the target's own sample, so the
// output distribution is exactly the target's: each position's uniform is
// independent of the ones before it, which alone decide its context.
//
//   TokenSampler sampler(params);
//   // row r of `logits` chooses the token at position first_position + r
//   std::vector<int32_t> choices = sampler.Choose(logits, first_position);
//   int acc = AcceptedPrefixLength(draft, choices);
#ifndef DEDIT_MODEL_SAMPLING_H_
#define DEDIT_MODEL_SAMPLING_H_

#include <ATen/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/engine/acceptance.h"
#include "common/engine/sampling_params.h"

namespace dedit {

// Philox4x32-10 (Salmon et al. 2011, as in Random123, cuRAND, PyTorch and
// JAX): 10 rounds over a 128-bit counter under a 64-bit key. Written here
// because libtorch 1.13 does not expose its CPU Philox per call (only as a
// stateful generator), and a draw must be addressable by position.
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter,
                                   std::array<uint32_t, 2> key);
// A uniform double in [0, 1) (53 bits) for (seed, position).
double PhiloxUniform(uint64_t seed, int64_t position);

class TokenSampler {
 public:
  // Unseeded params get a random seed here (the router draws one at
  // admission, so that a moved stream keeps it; this covers other callers).
  explicit TokenSampler(const SamplingParams& params);

  bool greedy() const { return params_.temperature == 0.0f; }
  // logits: [rows, vocab] float, any device; row r chooses the token at
  // absolute sequence position `first_position + r`. Returns the choice per
  // row.
  std::vector<int32_t> Choose(const at::Tensor& logits,
                              int64_t first_position) const;

 private:
  SamplingParams params_;
  uint64_t seed_ = 0;
};

}  // namespace dedit

#endif  // DEDIT_MODEL_SAMPLING_H_
