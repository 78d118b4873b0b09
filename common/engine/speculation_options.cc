#include "common/engine/speculation_options.h"

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace dedit {

absl::Status ValidateVerifyChunk(int chunk, absl::string_view name) {
  if (chunk == 0 || (chunk >= 2 && chunk <= kMaxVerifyChunk)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(name, " must be 0 (verify whole drafts) or in [2, ",
                   kMaxVerifyChunk, "], got ", chunk));
}

absl::Status ValidateSpeculationOptions(const SpeculationOptions& o) {
  if (absl::Status s = NgramDrafter::Validate(o.ngram); !s.ok()) {
    return Annotate(s, "--ngram_min/--ngram_max/--ngram_max_window");
  }
  if (o.hybrid_min_ngram < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--hybrid_min_ngram must be >= 1, got ", o.hybrid_min_ngram));
  }
  if (!(o.min_draft_confidence >= 0 && o.min_draft_confidence <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min_draft_confidence must be in [0, 1], got ",
                     o.min_draft_confidence));
  }
  RETURN_IF_ERROR(ValidateVerifyChunk(o.verify_chunk, "--verify_chunk"));
  if (o.max_speculative_batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_speculative_batch must be >= 0, got ", o.max_speculative_batch));
  }
  return absl::OkStatus();
}

}  // namespace dedit
