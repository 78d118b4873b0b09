// The acceptance rule of docs/ARCHITECTURE.md §1 step 5, as a pure function
// on token ids. The verifier applies it to the target's choices (and reports
// `accepted`); the engine reuses it only to classify edit passes after the
// fact, never to decide what is committed.
//
//   int acc = AcceptedPrefixLength(draft, target_choices);
#ifndef DEDIT_ENGINE_ACCEPTANCE_H_
#define DEDIT_ENGINE_ACCEPTANCE_H_

#include <cstdint>
#include <vector>

namespace dedit {

// Length of the longest prefix of `draft` (block slots 1..) that equals the
// target's choices at the preceding slots: draft[i] is accepted iff
// draft[0..i] all equal target_choices[0..i].
int AcceptedPrefixLength(const std::vector<int32_t>& draft,
                         const std::vector<int32_t>& target_choices);

}  // namespace dedit

#endif  // DEDIT_ENGINE_ACCEPTANCE_H_
