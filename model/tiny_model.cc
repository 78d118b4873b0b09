#include "model/tiny_model.h"

#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/safetensors.h"
#include "base/status.h"
#include "model/tensor_io.h"
#include "model/torch_status.h"

namespace dedit {
namespace {

class RandomWeights {
 public:
  RandomWeights(uint64_t seed, at::ScalarType dtype)
      : gen_(at::make_generator<at::CPUGeneratorImpl>(seed)), dtype_(dtype) {}

  absl::Status Normal(const std::string& name, std::vector<int64_t> shape,
                      double std) {
    return Add(name, at::normal(0.0, std, shape, gen_));
  }
  absl::Status Norm(const std::string& name, int64_t n) {
    return Add(name, 1.0 + at::normal(0.0, 0.1, {n}, gen_));
  }
  absl::Status Layer(const std::string& prefix, const Qwen3Config& c) {
    const int64_t d = c.hidden_size, hd = c.head_dim, ff = c.intermediate_size;
    const int64_t q = int64_t{c.num_attention_heads} * hd;
    const int64_t kv = int64_t{c.num_key_value_heads} * hd;
    const double s_in = 1.0 / std::sqrt(static_cast<double>(d));
    RETURN_IF_ERROR(Norm(prefix + "input_layernorm.weight", d));
    RETURN_IF_ERROR(Norm(prefix + "post_attention_layernorm.weight", d));
    RETURN_IF_ERROR(Normal(prefix + "self_attn.q_proj.weight", {q, d}, s_in));
    RETURN_IF_ERROR(Normal(prefix + "self_attn.k_proj.weight", {kv, d}, s_in));
    RETURN_IF_ERROR(Normal(prefix + "self_attn.v_proj.weight", {kv, d}, s_in));
    RETURN_IF_ERROR(Normal(prefix + "self_attn.o_proj.weight", {d, q},
                           1.0 / std::sqrt(static_cast<double>(q))));
    RETURN_IF_ERROR(Norm(prefix + "self_attn.q_norm.weight", hd));
    RETURN_IF_ERROR(Norm(prefix + "self_attn.k_norm.weight", hd));
    RETURN_IF_ERROR(Normal(prefix + "mlp.gate_proj.weight", {ff, d}, s_in));
    RETURN_IF_ERROR(Normal(prefix + "mlp.up_proj.weight", {ff, d}, s_in));
    RETURN_IF_ERROR(Normal(prefix + "mlp.down_proj.weight", {d, ff},
                           1.0 / std::sqrt(static_cast<double>(ff))));
    return absl::OkStatus();
  }
  std::vector<TensorToWrite>& tensors() { return tensors_; }

 private:
  absl::Status Add(const std::string& name, const at::Tensor& t) {
    ASSIGN_OR_RETURN(TensorToWrite w, FromTensor(name, t.to(dtype_)));
    tensors_.push_back(std::move(w));
    return absl::OkStatus();
  }
  at::Generator gen_;
  at::ScalarType dtype_;
  std::vector<TensorToWrite> tensors_;
};

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
  RETURN_IF_ERROR(MakeDirs(dir));
  return GuardTorch([&]() -> absl::Status {
    RandomWeights w(seed, dtype);
    RETURN_IF_ERROR(
        w.Normal("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, 1.0));
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      RETURN_IF_ERROR(w.Layer(absl::StrCat("model.layers.", l, "."), c));
    }
    RETURN_IF_ERROR(w.Norm("model.norm.weight", c.hidden_size));
    if (!c.tie_word_embeddings) {
      RETURN_IF_ERROR(w.Normal("lm_head.weight", {c.vocab_size, c.hidden_size},
                               1.0 / std::sqrt(c.hidden_size)));
    }
    RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", w.tensors(),
                                     {{"format", "pt"}}));
    return WriteTextFile(dir + "/config.json", Qwen3ConfigToJson(c));
  });
}

absl::Status WriteRandomDrafter(const std::string& dir, const DrafterConfig& d,
                                uint64_t seed) {
  const Qwen3Config& c = d.layers;
  ASSIGN_OR_RETURN(at::ScalarType dtype, ParseScalarType(c.dtype));
  RETURN_IF_ERROR(MakeDirs(dir));
  return GuardTorch([&]() -> absl::Status {
    RandomWeights w(seed, dtype);
    const int64_t fw = static_cast<int64_t>(d.target_layer_ids.size()) * c.hidden_size;
    RETURN_IF_ERROR(w.Normal("fc.weight", {c.hidden_size, fw},
                             1.0 / std::sqrt(static_cast<double>(fw))));
    RETURN_IF_ERROR(w.Norm("hidden_norm.weight", c.hidden_size));
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      RETURN_IF_ERROR(w.Layer(absl::StrCat("layers.", l, "."), c));
    }
    RETURN_IF_ERROR(w.Norm("norm.weight", c.hidden_size));
    RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", w.tensors(),
                                     {{"format", "pt"}}));
    return WriteTextFile(dir + "/config.json", DrafterConfigToJson(d));
  });
}

}  // namespace dedit
