// The SpeculationOptions flags (common/engine/speculation_options.h),
// defined once for every binary that runs a speculative engine:
// dedit-router (its GenerationLoop) and dedit-generate (in process). Each
// links dedit::speculation_flags and calls SpeculationOptionsFromFlags after
// parsing its command line.
//
//   --ngram_min, --ngram_max, --ngram_max_window   the n-gram method
//   --hybrid_min_ngram, --hybrid_short_match_below the hybrid method
//   --min_draft_confidence, --verify_chunk, --max_speculative_batch,
//   --adaptive_speculation
#ifndef DEDIT_ENGINE_SPECULATION_FLAGS_H_
#define DEDIT_ENGINE_SPECULATION_FLAGS_H_

#include "absl/status/statusor.h"
#include "common/engine/speculation_options.h"

namespace dedit {

// The options the flags set; INVALID_ARGUMENT naming the flag when one is
// out of range (ValidateSpeculationOptions).
absl::StatusOr<SpeculationOptions> SpeculationOptionsFromFlags();

}  // namespace dedit

#endif  // DEDIT_ENGINE_SPECULATION_FLAGS_H_
