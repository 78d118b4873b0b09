#include "router/stream_progress.h"

#include <algorithm>

namespace dedit {

GenerationRequest ResumedEngineRequest(const GenerationRequest& original,
                                       const StreamProgress& progress) {
  GenerationRequest r = original;
  r.prompt.insert(r.prompt.end(), progress.emitted.begin(),
                  progress.emitted.end());
  // A stream that had every token it may have has finished, not moved; at
  // least one keeps the request valid all the same.
  r.max_new_tokens = std::max(
      1, original.max_new_tokens - static_cast<int>(progress.emitted.size()));
  r.continue_sequence = 0;
  return r;
}

}  // namespace dedit
