// A target + DEdit drafter + engine in one process: what dedit-generate,
// the benchmarks and the tests run, and the reference the services must
// match token for token.
//
//   InProcessStack::Options o{.target_dir = "checkpoints/tiny/target",
//                             .drafter_dir = "checkpoints/tiny/drafter"};
//   ASSIGN_OR_RETURN(auto stack, InProcessStack::Load(o));
//   ASSIGN_OR_RETURN(auto results, stack->engine().Generate(requests));
#ifndef DEDIT_MODEL_IN_PROCESS_H_
#define DEDIT_MODEL_IN_PROCESS_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/speculative_engine.h"
#include "common/model/dedit_drafter.h"
#include "common/model/local_backends.h"
#include "common/model/qwen3_model.h"

namespace dedit {

class InProcessStack {
 public:
  struct Options {
    std::string target_dir;
    std::string drafter_dir;  // empty → target-only
    std::string device = "cpu";
    std::string dtype = "float32";
    std::optional<bool> causal_editor;  // overrides the checkpoint's choice
    SpeculationOptions speculation;     // the engine's
  };

  static absl::StatusOr<std::unique_ptr<InProcessStack>> Load(
      const Options& options);

  SpeculativeEngine& engine() { return *engine_; }
  Qwen3Model& target() { return *target_; }
  DEditDrafter* drafter() { return drafter_.get(); }  // null when target-only

 private:
  InProcessStack() = default;
  std::unique_ptr<Qwen3Model> target_;
  std::unique_ptr<DEditDrafter> drafter_;
  std::unique_ptr<LocalDrafter> local_drafter_;
  std::unique_ptr<LocalVerifier> verifier_;
  std::unique_ptr<SpeculativeEngine> engine_;
};

}  // namespace dedit

#endif  // DEDIT_MODEL_IN_PROCESS_H_
