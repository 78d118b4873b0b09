// Where the verifier side delivers committed tokens' context features: in
// process the LocalDrafter, in the target service the context stream to the
// drafter service. The round logic (engine/) never sees features.
#ifndef DEDIT_MODEL_CONTEXT_SINK_H_
#define DEDIT_MODEL_CONTEXT_SINK_H_

#include <ATen/Tensor.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/engine/draft.h"

namespace dedit {

// Receives committed tokens' context features from the verifier side.
class ContextSink {
 public:
  virtual ~ContextSink() = default;
  virtual absl::Status OnContext(SequenceId sequence, int64_t start,
                                 const at::Tensor& features) = 0;
};

}  // namespace dedit

#endif  // DEDIT_MODEL_CONTEXT_SINK_H_
