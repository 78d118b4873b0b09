#include "common/model/tensor_io.h"

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/ops/empty.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/model/torch_status.h"

namespace dedit {
namespace {

absl::StatusOr<at::ScalarType> ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return at::kDouble;
    case DType::kF32:
      return at::kFloat;
    case DType::kF16:
      return at::kHalf;
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kI64:
      return at::kLong;
    case DType::kI32:
      return at::kInt;
    case DType::kI16:
      return at::kShort;
    case DType::kI8:
      return at::kChar;
    case DType::kU8:
      return at::kByte;
    case DType::kBool:
      return at::kBool;
  }
  return absl::InvalidArgumentError("unknown dtype");
}

absl::StatusOr<DType> FromScalarType(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return DType::kF64;
    case at::kFloat:
      return DType::kF32;
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    case at::kLong:
      return DType::kI64;
    case at::kInt:
      return DType::kI32;
    case at::kShort:
      return DType::kI16;
    case at::kChar:
      return DType::kI8;
    case at::kByte:
      return DType::kU8;
    case at::kBool:
      return DType::kBool;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("cannot serialise dtype ", c10::toString(t)));
  }
}

}  // namespace

absl::StatusOr<at::Tensor> ToTensor(const TensorView& view,
                                    at::ScalarType dtype, c10::Device device) {
  ASSIGN_OR_RETURN(at::ScalarType source, ToScalarType(view.dtype));
  return GuardTorch([&]() -> at::Tensor {
    // Copy out of the mapping: views may be unaligned and the mapping is
    // read-only, and the model must not depend on the file staying open.
    at::Tensor cpu = at::empty(view.shape, at::TensorOptions().dtype(source));
    if (view.nbytes > 0) std::memcpy(cpu.data_ptr(), view.data, view.nbytes);
    if (source == at::kHalf) cpu = cpu.to(at::kFloat);
    return cpu.to(device, dtype).contiguous();
  });
}

absl::StatusOr<at::Tensor> LoadTensor(const WeightArchive& archive,
                                      const std::string& name,
                                      const std::vector<int64_t>& shape,
                                      at::ScalarType dtype,
                                      c10::Device device) {
  ASSIGN_OR_RETURN(TensorView view, archive.Get(name));
  if (view.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' has shape ", ShapeToString(view.shape),
        ", expected ", ShapeToString(shape)));
  }
  if (view.dtype != DType::kF32 && view.dtype != DType::kBF16 &&
      view.dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' has dtype ", DTypeName(view.dtype),
                     "; model weights must be F32, BF16 or F16"));
  }
  return ToTensor(view, dtype, device);
}

absl::StatusOr<TensorToWrite> FromTensor(const std::string& name,
                                         const at::Tensor& tensor) {
  ASSIGN_OR_RETURN(DType dtype, FromScalarType(tensor.scalar_type()));
  TensorToWrite out;
  out.name = name;
  out.dtype = dtype;
  out.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
  RETURN_IF_ERROR(GuardTorch([&] {
    at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
    out.bytes.assign(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes());
  }));
  return out;
}

absl::StatusOr<at::ScalarType> ParseScalarType(const std::string& name) {
  if (name == "float32" || name == "f32") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  if (name == "float16" || name == "f16") return at::kHalf;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' (float32, bfloat16, float16)"));
}

absl::StatusOr<c10::Device> ParseDevice(const std::string& name) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (name.size() > 5) {
      const std::string digits = name.substr(5);
      if (digits.empty() || digits.size() > 3 ||
          digits.find_first_not_of("0123456789") != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad device '", name, "' (cpu, cuda, cuda:N)"));
      }
      index = std::stoi(digits);
    }
    if (!at::hasCUDA()) {
      return absl::UnavailableError(absl::StrCat(
          "device '", name, "' requested but this build has no CUDA"));
    }
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("bad device '", name, "' (cpu, cuda, cuda:N)"));
}

}  // namespace dedit
