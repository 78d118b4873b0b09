// The one conversion from libtorch exceptions to absl::Status.
//
// libtorch reports shape errors, OOM and bad arguments by throwing c10::Error.
// Engine entry points wrap their tensor code in GuardTorch so that callers
// only ever see a Status:
//
//   absl::StatusOr<at::Tensor> out = GuardTorch([&] { return a.matmul(b); });
//
// IsStickyDeviceError tells the errors after which the process's device is
// unusable (the model threads poison themselves on those: model_thread.h).
#ifndef DEDIT_MODEL_TORCH_STATUS_H_
#define DEDIT_MODEL_TORCH_STATUS_H_

#include <c10/util/Exception.h>

#include <type_traits>
#include <utility>

#include "absl/strings/string_view.h"
#include "common/base/status.h"

namespace dedit {

// Maps a c10::Error to a Status. Out-of-memory becomes RESOURCE_EXHAUSTED
// (retry later may succeed); everything else is INTERNAL, because the engine
// validates user input before it reaches libtorch.
absl::Status FromTorchError(const c10::Error& error);

// Whether a libtorch error message reports a sticky device error: the CUDA
// context is corrupted and every later kernel or copy in the process fails
// too, so only a restart helps. Sticky: "CUDA error: ..." (a device-side
// assert, an illegal memory access, a misaligned address, an unspecified
// launch failure, ...) and failed cuBLAS/cuDNN calls ("CUBLAS_STATUS_...",
// "CUDNN_STATUS_..."). Not sticky: out of memory in any form ("CUDA out of
// memory", "CUDA error: out of memory", CUBLAS_STATUS_ALLOC_FAILED: freeing
// memory helps), and every CPU error (shape, dtype, index, allocation).
bool IsStickyDeviceError(absl::string_view message);

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
