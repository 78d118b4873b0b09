// The bridge between safetensors views and libtorch tensors.
//
//   ASSIGN_OR_RETURN(at::Tensor w,
//                    LoadTensor(*archive, "model.norm.weight", {1024},
//                               at::kFloat, device));
#ifndef DEDIT_MODEL_TENSOR_IO_H_
#define DEDIT_MODEL_TENSOR_IO_H_

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/safetensors.h"

namespace dedit {

// Copies `view` into a new tensor of `dtype` on `device`. F16 is widened on
// the CPU first: libtorch 1.13 has no f16 matmul on CPU.
absl::StatusOr<at::Tensor> ToTensor(const TensorView& view,
                                    at::ScalarType dtype, c10::Device device);

// Loads `name` from `archive`, checking its shape (INVALID_ARGUMENT naming
// the tensor and both shapes when it differs).
absl::StatusOr<at::Tensor> LoadTensor(const WeightArchive& archive,
                                      const std::string& name,
                                      const std::vector<int64_t>& shape,
                                      at::ScalarType dtype, c10::Device device);

// Serialises a tensor (any device; F32/BF16/F16/I64/I32/U8/Bool) for
// WriteSafetensors.
absl::StatusOr<TensorToWrite> FromTensor(const std::string& name,
                                         const at::Tensor& tensor);

// "float32" / "bfloat16" / "float16" → scalar type.
absl::StatusOr<at::ScalarType> ParseScalarType(const std::string& name);

// "cpu", "cuda", "cuda:N" → device; INVALID_ARGUMENT for anything else, and
// UNAVAILABLE when CUDA is asked for but not built or present.
absl::StatusOr<c10::Device> ParseDevice(const std::string& name);

}  // namespace dedit

#endif  // DEDIT_MODEL_TENSOR_IO_H_
