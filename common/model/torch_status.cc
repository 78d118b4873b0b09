#include "common/model/torch_status.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dedit {

absl::Status FromTorchError(const c10::Error& error) {
  const std::string msg = error.what_without_backtrace();
  if (msg.find("out of memory") != std::string::npos) {
    return absl::ResourceExhaustedError(absl::StrCat("libtorch: ", msg));
  }
  return absl::InternalError(absl::StrCat("libtorch: ", msg));
}

bool IsStickyDeviceError(absl::string_view message) {
  // Allocation failures first: they also come as "CUDA error: out of
  // memory" or a cuBLAS status, and freeing memory makes them go away.
  if (absl::StrContains(message, "out of memory") ||
      absl::StrContains(message, "CUBLAS_STATUS_ALLOC_FAILED") ||
      absl::StrContains(message, "CUDNN_STATUS_ALLOC_FAILED")) {
    return false;
  }
  for (absl::string_view sticky :
       {"CUDA error", "device-side assert", "illegal memory access",
        "CUBLAS_STATUS_", "CUDNN_STATUS_", "cuDNN error"}) {
    if (absl::StrContains(message, sticky)) return true;
  }
  return false;
}

}  // namespace dedit
