// Tensors on the wire ({dtype, shape, bytes}, dedit/v1/tensor.proto),
// without libtorch: the services convert to and from at::Tensor themselves
// (the target sends context features as bfloat16, half the bytes of f32;
// the drafter projects them with fc in its own compute dtype anyway).
//
//   SetWireTensor(WireDtype::kBFloat16, {n, width}, cpu_bf16.data_ptr(),
//                 n * width * 2, chunk.mutable_features());
//   ASSIGN_OR_RETURN(WireTensorView view, ViewWireTensor(chunk.features()));
#ifndef DEDIT_PROTO_TENSOR_WIRE_H_
#define DEDIT_PROTO_TENSOR_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dedit/v1/tensor.pb.h"

namespace dedit {

enum class WireDtype { kBFloat16, kFloat16, kFloat32 };

const char* WireDtypeName(WireDtype dtype);  // "bfloat16", ...
size_t WireDtypeBytes(WireDtype dtype);

// Fills `out`; `data` holds `bytes` bytes, row-major, little-endian.
void SetWireTensor(WireDtype dtype, const std::vector<int64_t>& shape,
                   const void* data, size_t bytes, v1::Tensor* out);

struct WireTensorView {
  WireDtype dtype = WireDtype::kFloat32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // into the message; valid while it lives
  size_t bytes = 0;
};

// INVALID_ARGUMENT for an unknown dtype, a negative or huge dimension, or a
// byte count that does not match the shape.
absl::StatusOr<WireTensorView> ViewWireTensor(const v1::Tensor& wire);

}  // namespace dedit

#endif  // DEDIT_PROTO_TENSOR_WIRE_H_
