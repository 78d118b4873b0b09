#include "proto/tensor_wire.h"

#include "absl/strings/str_cat.h"

namespace dedit {

const char* WireDtypeName(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kBFloat16:
      return "bfloat16";
    case WireDtype::kFloat16:
      return "float16";
    case WireDtype::kFloat32:
      return "float32";
  }
  return "unknown";
}

size_t WireDtypeBytes(WireDtype dtype) {
  return dtype == WireDtype::kFloat32 ? 4 : 2;
}

void SetWireTensor(WireDtype dtype, const std::vector<int64_t>& shape,
                   const void* data, size_t bytes, v1::Tensor* out) {
  out->set_dtype(WireDtypeName(dtype));
  out->clear_shape();
  for (int64_t d : shape) out->add_shape(d);
  out->set_data(static_cast<const char*>(data), bytes);
}

absl::StatusOr<WireTensorView> ViewWireTensor(const v1::Tensor& wire) {
  WireTensorView view;
  if (wire.dtype() == "bfloat16") {
    view.dtype = WireDtype::kBFloat16;
  } else if (wire.dtype() == "float16") {
    view.dtype = WireDtype::kFloat16;
  } else if (wire.dtype() == "float32") {
    view.dtype = WireDtype::kFloat32;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported wire dtype '", wire.dtype(), "'"));
  }
  int64_t numel = 1;
  for (int64_t d : wire.shape()) {
    if (d < 0 || (d > 0 && numel > (int64_t{1} << 40) / d)) {
      return absl::InvalidArgumentError(
          "tensor shape is negative or too large");
    }
    numel *= d;
    view.shape.push_back(d);
  }
  const size_t bytes = static_cast<size_t>(numel) * WireDtypeBytes(view.dtype);
  if (bytes != wire.data().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor of ", numel, " ", wire.dtype(), " elements needs ",
                     bytes, " bytes, got ", wire.data().size()));
  }
  view.data = wire.data().data();
  view.bytes = bytes;
  return view;
}

}  // namespace dedit
