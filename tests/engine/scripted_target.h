// A torch-free target for engine tests: its greedy answer to its one prompt
// is a fixed token list, and it verifies blocks against it.
#ifndef DEDIT_TESTS_ENGINE_SCRIPTED_TARGET_H_
#define DEDIT_TESTS_ENGINE_SCRIPTED_TARGET_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "common/engine/round_interfaces.h"

namespace dedit {

// A target whose greedy answer to its one prompt is `answer` (then 0s).
class ScriptedTarget : public Verifier {
 public:
  ScriptedTarget(int64_t prompt_length, std::vector<int32_t> answer)
      : prompt_length_(prompt_length), answer_(std::move(answer)) {}

  absl::StatusOr<TargetStepResult> Step(
      const std::vector<PrefillWork>& prefills,
      const std::vector<VerifyWork>& verifies) override {
    TargetStepResult out;
    for (size_t i = 0; i < prefills.size(); ++i)
      out.first_tokens.push_back(At(0));
    for (const VerifyWork& v : verifies) {
      // Slot 0 is the bonus at position start: answer index start - plen.
      const int64_t first = v.start - prompt_length_;
      VerifyOutcome o;
      for (size_t j = 0; j < v.block.size(); ++j) {
        o.target_tokens.push_back(At(first + static_cast<int64_t>(j) + 1));
      }
      while (o.accepted + 1 < static_cast<int>(v.block.size()) &&
             v.block[o.accepted + 1] == At(first + o.accepted + 1)) {
        ++o.accepted;
      }
      out.verified.push_back(std::move(o));
    }
    return out;
  }
  absl::Status Release(SequenceId) override { return absl::OkStatus(); }

  int32_t At(int64_t i) const {
    return i < static_cast<int64_t>(answer_.size()) ? answer_[i] : 0;
  }

 private:
  int64_t prompt_length_;
  std::vector<int32_t> answer_;
};

}  // namespace dedit

#endif  // DEDIT_TESTS_ENGINE_SCRIPTED_TARGET_H_
