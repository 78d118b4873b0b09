// The one conversion from libtorch exceptions to absl::Status.
//
// libtorch reports shape errors, OOM and bad arguments by throwing c10::Error.
// Engine entry points wrap their tensor code in GuardTorch so that callers
// only ever see a Status:
//
//   absl::StatusOr<at::Tensor> out = GuardTorch([&] { return a.matmul(b); });
#ifndef DEDIT_MODEL_TORCH_STATUS_H_
#define DEDIT_MODEL_TORCH_STATUS_H_

#include <c10/util/Exception.h>

#include <type_traits>
#include <utility>

#include "base/status.h"

namespace dedit {

// Maps a c10::Error to a Status. Out-of-memory becomes RESOURCE_EXHAUSTED
// (retry later may succeed); everything else is INTERNAL, because the engine
// validates user input before it reaches libtorch.
absl::Status FromTorchError(const c10::Error& error);

// Runs `fn`, converting a thrown c10::Error into a Status. `fn` may return
// void, absl::Status, absl::StatusOr<T> or a plain T (wrapped in StatusOr).
template <typename Fn>
auto GuardTorch(Fn&& fn) {
  using R = std::invoke_result_t<Fn>;
  if constexpr (std::is_void_v<R>) {
    try {
      fn();
      return absl::OkStatus();
    } catch (const c10::Error& e) {
      return FromTorchError(e);
    }
  } else if constexpr (std::is_same_v<R, absl::Status>) {
    try {
      return fn();
    } catch (const c10::Error& e) {
      return FromTorchError(e);
    }
  } else {
    using Out = std::conditional_t<std::is_convertible_v<absl::Status, R>, R,
                                   absl::StatusOr<R>>;
    try {
      return Out(fn());
    } catch (const c10::Error& e) {
      return Out(FromTorchError(e));
    }
  }
}

}  // namespace dedit

#endif  // DEDIT_MODEL_TORCH_STATUS_H_
