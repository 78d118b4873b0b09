#include "common/engine/acceptance.h"

#include <algorithm>

namespace dedit {

int AcceptedPrefixLength(const std::vector<int32_t>& draft,
                         const std::vector<int32_t>& target_choices) {
  const size_t n = std::min(draft.size(), target_choices.size());
  size_t acc = 0;
  while (acc < n && draft[acc] == target_choices[acc]) ++acc;
  return static_cast<int>(acc);
}

}  // namespace dedit
