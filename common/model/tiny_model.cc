#include "common/model/tiny_model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <cmath>
#include <utility>
#include <vector>

#include "common/base/checkpoint_layout.h"
#include "common/base/file_util.h"
#include "common/base/safetensors.h"
#include "common/base/status.h"
#include "common/model/tensor_io.h"
#include "common/model/torch_status.h"

namespace dedit {
namespace {

// N(0, 1) embeddings, norm scales 1 + N(0, 0.1), and every other (linear,
// [out, in]) weight N(0, 1/sqrt(in)), drawn from one generator in checkpoint
// layout order.
absl::StatusOr<std::vector<TensorToWrite>> RandomCheckpoint(
    const std::vector<CheckpointTensor>& layout, uint64_t seed,
    at::ScalarType dtype) {
  return GuardTorch([&]() -> absl::StatusOr<std::vector<TensorToWrite>> {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    std::vector<TensorToWrite> tensors;
    for (const CheckpointTensor& t : layout) {
      at::Tensor value;
      switch (t.role) {
        case TensorRole::kEmbedding:
          value = at::normal(0.0, 1.0, t.shape, gen);
          break;
        case TensorRole::kNorm:
          value = 1.0 + at::normal(0.0, 0.1, t.shape, gen);
          break;
        case TensorRole::kLmHead:
        case TensorRole::kProjection:
        case TensorRole::kResidualOutput:
          value = at::normal(
              0.0, 1.0 / std::sqrt(static_cast<double>(t.shape.at(1))), t.shape,
              gen);
          break;
      }
      ASSIGN_OR_RETURN(TensorToWrite w, FromTensor(t.name, value.to(dtype)));
      tensors.push_back(std::move(w));
    }
    return tensors;
  });
}

// config.json + model.safetensors (with the "format": "pt" metadata that HF
// loaders look for) in `dir`.
absl::Status WriteCheckpoint(const std::string& dir,
                             const std::vector<TensorToWrite>& tensors,
                             const std::string& config_json) {
  RETURN_IF_ERROR(MakeDirs(dir));
  RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", tensors,
                                   {{"format", "pt"}}));
  return WriteFileAtomically(dir + "/config.json", config_json);
}

}  // namespace

TinyModelSpec DefaultTinySpec() {
  TinyModelSpec spec;
  Qwen3Config& t = spec.target;
  t.vocab_size = 128;
  t.hidden_size = 64;
  t.intermediate_size = 128;
  t.num_hidden_layers = 4;
  t.num_attention_heads = 4;
  t.num_key_value_heads = 2;
  t.head_dim = 16;
  t.rope_theta = 10000.0;
  t.max_position_embeddings = 2048;
  t.tie_word_embeddings = true;
  t.dtype = "float32";
  DrafterConfig& d = spec.drafter;
  d.layers = t;
  d.layers.num_hidden_layers = 2;
  d.block_size = 32;
  d.mask_token_id = t.vocab_size - 1;
  d.target_layer_ids = {1, 2};
  d.num_target_layers = t.num_hidden_layers;
  d.num_passes = 3;
  d.has_dedit_config = true;
  return spec;
}

absl::Status WriteRandomQwen3(const std::string& dir, const Qwen3Config& c,
                              uint64_t seed) {
  ASSIGN_OR_RETURN(at::ScalarType dtype, ParseScalarType(c.dtype));
  ASSIGN_OR_RETURN(std::vector<TensorToWrite> tensors,
                   RandomCheckpoint(TargetCheckpointLayout(c), seed, dtype));
  return WriteCheckpoint(dir, tensors, Qwen3ConfigToJson(c));
}

absl::Status WriteRandomDrafter(const std::string& dir, const DrafterConfig& d,
                                uint64_t seed) {
  ASSIGN_OR_RETURN(at::ScalarType dtype, ParseScalarType(d.layers.dtype));
  ASSIGN_OR_RETURN(std::vector<TensorToWrite> tensors,
                   RandomCheckpoint(DrafterCheckpointLayout(d), seed, dtype));
  return WriteCheckpoint(dir, tensors, DrafterConfigToJson(d));
}

}  // namespace dedit
