#include "common/engine/ngram_drafter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dedit {

absl::Status NgramDrafter::Validate(const Options& o) {
  if (o.min_ngram < 1 || o.max_ngram < o.min_ngram) {
    return absl::InvalidArgumentError(
        absl::StrCat("n-gram sizes must satisfy 1 <= min <= max, got min ",
                     o.min_ngram, " max ", o.max_ngram));
  }
  if (o.max_window < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("n-gram max window must be >= 2, got ", o.max_window));
  }
  return absl::OkStatus();
}

std::vector<int32_t> NgramDrafter::Propose(const std::vector<int32_t>& known,
                                           int max_tokens) const {
  std::vector<int32_t> proposal;
  const int64_t length = static_cast<int64_t>(known.size());
  if (max_tokens <= 0) return proposal;
  for (int n = std::min<int64_t>(options_.max_ngram, length - 1);
       n >= options_.min_ngram; --n) {
    const int64_t suffix = length - n;
    // Latest earlier occurrence: it starts before `suffix`, so at least one
    // known token follows it.
    for (int64_t p = suffix - 1; p >= 0; --p) {
      if (!std::equal(known.begin() + p, known.begin() + p + n,
                      known.begin() + suffix)) {
        continue;
      }
      for (int64_t i = p + n; static_cast<int>(proposal.size()) < max_tokens;
           ++i) {
        proposal.push_back(i < length ? known[i] : proposal[i - length]);
      }
      return proposal;
    }
  }
  return proposal;
}

DraftResult NgramDrafter::AsDraft(std::vector<int32_t> proposal) {
  DraftResult result;
  result.passes.push_back({std::move(proposal), {}});
  result.passes.back().confidences.assign(result.passes.back().tokens.size(),
                                          1.0f);
  return result;
}

absl::StatusOr<std::vector<DraftResult>> NgramDrafter::Draft(
    const std::vector<DraftRequest>& requests) {
  std::vector<DraftResult> results;
  results.reserve(requests.size());
  for (const DraftRequest& r : requests) {
    if (r.tokens == nullptr ||
        static_cast<int64_t>(r.tokens->size()) != r.start + 1 ||
        r.tokens->back() != r.bonus) {
      return absl::InvalidArgumentError(absl::StrCat(
          "n-gram draft for sequence ", r.sequence,
          " needs its known tokens (start + 1, ending with the bonus)"));
    }
    if (r.passes != 1 || r.window < 2 || r.window > options_.max_window) {
      return absl::InvalidArgumentError(
          absl::StrCat("n-gram draft for sequence ", r.sequence, ": window ",
                       r.window, " must be in [2, ", options_.max_window,
                       "] and passes ", r.passes, " must be 1"));
    }
    results.push_back(AsDraft(Propose(*r.tokens, r.window - 1)));
  }
  return results;
}

NgramDrafter::Options LookupSeedOptions(int min_ngram, int max_window) {
  NgramDrafter::Options o;
  o.min_ngram = min_ngram;
  o.max_ngram = std::max(min_ngram, 4);
  o.max_window = max_window;
  return o;
}

absl::Status CheckDraftSeed(const DraftRequest& r, int vocab_size) {
  if (r.seed.size() > static_cast<size_t>(std::max(r.window - 1, 0))) {
    return absl::InvalidArgumentError(
        absl::StrCat("seed of ", r.seed.size(), " tokens for window ", r.window,
                     " (at most ", r.window - 1, ")"));
  }
  for (int32_t t : r.seed) {
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("seed token ", t, " outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

}  // namespace dedit
