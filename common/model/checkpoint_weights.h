// The libtorch half of the checkpoint layout (common/base/checkpoint_layout.h):
// loads every tensor a layout lists, and binds one decoder layer's tensors
// by name into the DecoderLayerWeights the forward code uses. The engine's
// loaders and the trainer both go through here, so a checkpoint is read and
// checked the same way everywhere.
//
//   const auto layout = TargetCheckpointLayout(config, archive);
//   ASSIGN_OR_RETURN(NamedTensors w,
//                    LoadCheckpointTensors(archive, layout, dtype, device));
//   ASSIGN_OR_RETURN(DecoderLayerWeights l0,
//                    BindDecoderLayer(w, TargetLayerTensorNames(0)));
#ifndef DEDIT_MODEL_CHECKPOINT_WEIGHTS_H_
#define DEDIT_MODEL_CHECKPOINT_WEIGHTS_H_

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/base/checkpoint_layout.h"
#include "common/base/safetensors.h"
#include "common/model/transformer_ops.h"

namespace dedit {

// Tensors by checkpoint name.
using NamedTensors = std::unordered_map<std::string, at::Tensor>;

// Checks the whole layout first (CheckCheckpointLayout: NOT_FOUND or
// INVALID_ARGUMENT naming the tensor and both shapes), so a bad checkpoint
// fails before any weight is copied; then loads each tensor in `dtype` on
// `device` (LoadTensor, common/model/tensor_io.h: weights must be
// F32/BF16/F16).
absl::StatusOr<NamedTensors> LoadCheckpointTensors(
    const WeightArchive& archive, const std::vector<CheckpointTensor>& layout,
    at::ScalarType dtype, c10::Device device);

// tensors[name]; NOT_FOUND naming the tensor when absent.
absl::StatusOr<at::Tensor> FindTensor(const NamedTensors& tensors,
                                      absl::string_view name);

// The tensors of one decoder layer, shared (not copied) from `tensors`.
// NOT_FOUND naming the first absent tensor.
absl::StatusOr<DecoderLayerWeights> BindDecoderLayer(
    const NamedTensors& tensors, const DecoderLayerTensorNames& names);

}  // namespace dedit

#endif  // DEDIT_MODEL_CHECKPOINT_WEIGHTS_H_
