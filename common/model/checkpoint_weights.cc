#include "common/model/checkpoint_weights.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/model/tensor_io.h"

namespace dedit {

absl::StatusOr<NamedTensors> LoadCheckpointTensors(
    const WeightArchive& archive, const std::vector<CheckpointTensor>& layout,
    at::ScalarType dtype, c10::Device device) {
  RETURN_IF_ERROR(CheckCheckpointLayout(archive, layout));
  NamedTensors tensors;
  for (const CheckpointTensor& t : layout) {
    ASSIGN_OR_RETURN(at::Tensor value,
                     LoadTensor(archive, t.name, t.shape, dtype, device));
    tensors.emplace(t.name, std::move(value));
  }
  return tensors;
}

absl::StatusOr<at::Tensor> FindTensor(const NamedTensors& tensors,
                                      absl::string_view name) {
  auto it = tensors.find(std::string(name));
  if (it == tensors.end()) {
    return absl::NotFoundError(absl::StrCat("tensor '", name, "' not loaded"));
  }
  return it->second;
}

absl::StatusOr<DecoderLayerWeights> BindDecoderLayer(
    const NamedTensors& tensors, const DecoderLayerTensorNames& n) {
  DecoderLayerWeights w;
  const std::pair<const std::string*, at::Tensor*> fields[] = {
      {&n.input_layernorm, &w.input_layernorm},
      {&n.post_attention_layernorm, &w.post_attention_layernorm},
      {&n.q_proj, &w.q_proj},
      {&n.k_proj, &w.k_proj},
      {&n.v_proj, &w.v_proj},
      {&n.o_proj, &w.o_proj},
      {&n.q_norm, &w.q_norm},
      {&n.k_norm, &w.k_norm},
      {&n.gate_proj, &w.gate_proj},
      {&n.up_proj, &w.up_proj},
      {&n.down_proj, &w.down_proj},
  };
  for (const auto& [name, field] : fields) {
    ASSIGN_OR_RETURN(*field, FindTensor(tensors, *name));
  }
  return w;
}

}  // namespace dedit
