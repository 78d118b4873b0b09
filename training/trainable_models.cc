#include "training/trainable_models.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/checkpoint_layout.h"
#include "common/base/file_util.h"
#include "common/base/safetensors.h"
#include "common/base/status.h"
#include "common/model/checkpoint_weights.h"
#include "common/model/tensor_io.h"
#include "common/model/torch_status.h"

namespace dedit::training {
namespace {

// Fresh fp32 parameters for `layout`: norms 1, embeddings and linear
// layers N(0, 0.02), residual-branch outputs (o_proj, down_proj) GPT-2 style
// N(0, 0.02 / sqrt(2 L)) so that the residual stream's scale does not grow
// with the number of layers. Drawn from one generator in layout order.
absl::StatusOr<ParameterList> InitParameters(
    const std::vector<CheckpointTensor>& layout, int num_layers,
    uint64_t seed) {
  return GuardTorch([&] {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const double out_std = 0.02 / std::sqrt(2.0 * std::max(num_layers, 1));
    ParameterList params;
    for (const CheckpointTensor& s : layout) {
      at::Tensor t;
      switch (s.role) {
        case TensorRole::kNorm:
          t = at::ones(s.shape, at::TensorOptions().dtype(at::kFloat));
          break;
        case TensorRole::kEmbedding:
        case TensorRole::kLmHead:
        case TensorRole::kProjection:
          t = at::normal(0.0, 0.02, s.shape, gen);
          break;
        case TensorRole::kResidualOutput:
          t = at::normal(0.0, out_std, s.shape, gen);
          break;
      }
      params.push_back(
          {s.name, t.to(at::kFloat).contiguous().requires_grad_(true)});
    }
    return params;
  });
}

// The tensors of `layout` from `archive` (shape-checked), as trainable fp32
// parameters in layout order.
absl::StatusOr<ParameterList> LoadParameters(
    const WeightArchive& archive, const std::vector<CheckpointTensor>& layout) {
  ASSIGN_OR_RETURN(const NamedTensors loaded,
                   LoadCheckpointTensors(archive, layout, at::kFloat,
                                         c10::Device(c10::kCPU)));
  ParameterList params;
  for (const CheckpointTensor& s : layout) {
    ASSIGN_OR_RETURN(at::Tensor t, FindTensor(loaded, s.name));
    RETURN_IF_ERROR(GuardTorch([&] { t.requires_grad_(true); }));
    params.push_back({s.name, std::move(t)});
  }
  return params;
}

NamedTensors ByName(const ParameterList& params) {
  NamedTensors map;
  for (const NamedParameter& p : params) map[p.name] = p.value;
  return map;
}

// Depth up-scaling (TrainableTarget::Grow, TrainableDrafter::Grow): copies
// `from` (a model of `old_layers` layers) into `to`, a fresh model of the
// same shape but config.num_hidden_layers layers. Every tensor outside the
// layers comes from `from`; old layer i becomes layer
// floor(i * new / old); each new layer keeps its fresh values except o_proj
// and down_proj, zeroed, so that it adds nothing to the residual stream
// until training moves them.
absl::Status SpreadLayers(const ParameterList& from, int old_layers,
                          DecoderLayerTensorNames (*layer_names)(int),
                          const Qwen3Config& config, ParameterList& to,
                          const char* what) {
  const int num_layers = config.num_hidden_layers;
  // The name in `from` of each tensor of `to` that comes from it.
  std::map<std::string, std::string> source;
  std::set<std::string> zeroed;
  for (const NamedParameter& p : to) source[p.name] = p.name;
  std::vector<bool> is_old(num_layers, false);
  for (int i = 0; i < old_layers; ++i) {
    const int l =
        static_cast<int>(static_cast<int64_t>(i) * num_layers / old_layers);
    is_old[l] = true;
    const std::vector<CheckpointTensor> dst =
        DecoderLayerLayout(layer_names(l), config);
    const std::vector<CheckpointTensor> src =
        DecoderLayerLayout(layer_names(i), config);
    for (size_t k = 0; k < dst.size(); ++k) source[dst[k].name] = src[k].name;
  }
  for (int l = 0; l < num_layers; ++l) {
    if (is_old[l]) continue;
    const DecoderLayerTensorNames names = layer_names(l);
    for (const CheckpointTensor& c : DecoderLayerLayout(names, config)) {
      source.erase(c.name);
    }
    zeroed.insert(names.o_proj);
    zeroed.insert(names.down_proj);
  }
  const NamedTensors old = ByName(from);
  return GuardTorch([&]() -> absl::Status {
    at::NoGradGuard no_grad;
    for (NamedParameter& p : to) {
      if (zeroed.count(p.name)) p.value.zero_();
      auto s = source.find(p.name);
      if (s == source.end()) continue;  // a new layer's
      auto it = old.find(s->second);
      if (it == old.end() || !it->second.sizes().equals(p.value.sizes())) {
        return absl::InternalError(absl::StrCat("the ", what,
                                                " being grown has no tensor ",
                                                s->second, " of that shape"));
      }
      p.value.copy_(it->second);
    }
    return absl::OkStatus();
  });
}

// Positions 0..T-1 repeated for B rows, flattened: [B * T].
at::Tensor TiledPositions(int64_t batch, int64_t length) {
  return at::arange(length, at::TensorOptions().dtype(at::kLong))
      .repeat({batch});
}

}  // namespace

absl::Status ExportCheckpoint(
    const std::string& dir, const ParameterList& params,
    const std::vector<CheckpointTensor>& layout, at::ScalarType dtype,
    const std::string& config_json,
    const std::map<std::string, std::string>& extra_files) {
  if (params.size() != layout.size()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot export ",
                                                   params.size(),
                                                   " parameters as a "
                                                   "checkpoint of ",
                                                   layout.size(), " tensors"));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<int64_t> shape(params[i].value.sizes().begin(),
                                     params[i].value.sizes().end());
    if (params[i].name != layout[i].name || shape != layout[i].shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot export parameter '", params[i].name, "' ",
          ShapeToString(shape), " where the checkpoint layout has '",
          layout[i].name, "' ", ShapeToString(layout[i].shape)));
    }
  }
  RETURN_IF_ERROR(MakeDirs(dir));
  std::vector<TensorToWrite> tensors;
  for (const NamedParameter& p : params) {
    at::Tensor value;
    RETURN_IF_ERROR(
        GuardTorch([&] { value = p.value.detach().to(dtype).contiguous(); }));
    ASSIGN_OR_RETURN(TensorToWrite w, FromTensor(p.name, value));
    tensors.push_back(std::move(w));
  }
  RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", tensors,
                                   {{"format", "pt"}}));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/config.json", config_json));
  for (const auto& [name, text] : extra_files) {
    RETURN_IF_ERROR(WriteFileAtomically(dir + "/" + name, text));
  }
  return absl::OkStatus();
}

// --------------------------------------------------------------------------
// Target

absl::StatusOr<TrainableTarget> TrainableTarget::Init(const Qwen3Config& config,
                                                      uint64_t seed) {
  TrainableTarget t;
  t.config_ = config;
  ASSIGN_OR_RETURN(t.params_, InitParameters(TargetCheckpointLayout(config),
                                             config.num_hidden_layers, seed));
  RETURN_IF_ERROR(t.BindViews());
  return t;
}

absl::StatusOr<TrainableTarget> TrainableTarget::Load(const std::string& dir) {
  TrainableTarget t;
  ASSIGN_OR_RETURN(t.config_, LoadQwen3Config(dir));
  // A tied checkpoint may still carry lm_head.weight; train it untied then.
  ASSIGN_OR_RETURN(auto archive, WeightArchive::OpenDirectory(dir));
  if (archive->Contains(kLmHeadWeight)) t.config_.tie_word_embeddings = false;
  ASSIGN_OR_RETURN(t.params_,
                   LoadParameters(*archive, TargetCheckpointLayout(t.config_)));
  RETURN_IF_ERROR(t.BindViews());
  return t;
}

absl::StatusOr<TrainableTarget> TrainableTarget::Grow(
    const TrainableTarget& from, int num_layers, uint64_t seed) {
  const int old_layers = from.config_.num_hidden_layers;
  if (num_layers < old_layers) {
    return absl::InvalidArgumentError(absl::StrCat("cannot grow a ", old_layers,
                                                   "-layer target to ",
                                                   num_layers, " layers"));
  }
  Qwen3Config config = from.config_;
  config.num_hidden_layers = num_layers;
  ASSIGN_OR_RETURN(TrainableTarget t, Init(config, seed));
  RETURN_IF_ERROR(SpreadLayers(from.params_, old_layers, TargetLayerTensorNames,
                               config, t.params_, "target"));
  return t;
}

absl::Status TrainableTarget::BindViews() {
  const NamedTensors m = ByName(params_);
  ASSIGN_OR_RETURN(embed_tokens_, FindTensor(m, kEmbedTokensWeight));
  lm_head_ = embed_tokens_;
  if (!config_.tie_word_embeddings) {
    ASSIGN_OR_RETURN(lm_head_, FindTensor(m, kLmHeadWeight));
  }
  ASSIGN_OR_RETURN(final_norm_, FindTensor(m, kTargetNormWeight));
  layers_.clear();
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    ASSIGN_OR_RETURN(DecoderLayerWeights w,
                     BindDecoderLayer(m, TargetLayerTensorNames(l)));
    layers_.push_back(std::move(w));
  }
  return GuardTorch([&] {
    rotary_ =
        Rotary(config_.head_dim, config_.rope_theta, c10::Device(c10::kCPU));
  });
}

void TrainableTarget::Freeze() {
  for (NamedParameter& p : params_) p.value.requires_grad_(false);
}

at::Tensor TrainableTarget::Forward(const at::Tensor& ids,
                                    const std::vector<int>& feature_layer_ids,
                                    at::Tensor* features) const {
  const Qwen3Config& c = config_;
  const int64_t b = ids.size(0), t = ids.size(1), n = b * t;
  const int64_t kvh = c.num_key_value_heads, hd = c.head_dim;
  const int64_t group = c.num_attention_heads / c.num_key_value_heads;
  at::Tensor x = at::embedding(embed_tokens_, ids.reshape({n}));  // [n, D]
  at::Tensor cos, sin;
  rotary_.Tables(TiledPositions(b, t), x.scalar_type(), &cos, &sin);
  // Causal mask shared by every (batch, head): key j visible iff j <= i.
  at::Tensor idx = at::arange(t, at::TensorOptions().dtype(at::kLong));
  at::Tensor blocked = idx.view({1, t}) > idx.view({t, 1});
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<at::Tensor> feats(feature_layer_ids.size());
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const DecoderLayerWeights& w = layers_[l];
    at::Tensor h = RmsNorm(x, w.input_layernorm, c.rms_norm_eps);
    at::Tensor q =
        NormAndRotateHeads(at::linear(h, w.q_proj), c.num_attention_heads, hd,
                           w.q_norm, c.rms_norm_eps, cos, sin);
    at::Tensor k = NormAndRotateHeads(at::linear(h, w.k_proj), kvh, hd,
                                      w.k_norm, c.rms_norm_eps, cos, sin);
    at::Tensor v = at::linear(h, w.v_proj);
    // Query head h uses kv head h / group: [B, kv, group * T, hd].
    at::Tensor qg = q.view({b, t, kvh, group, hd})
                        .permute({0, 2, 3, 1, 4})
                        .reshape({b, kvh, group * t, hd});
    at::Tensor kk =
        k.view({b, t, kvh, hd}).permute({0, 2, 3, 1});  // [B,kv,hd,T]
    at::Tensor vv =
        v.view({b, t, kvh, hd}).permute({0, 2, 1, 3});  // [B,kv,T,hd]
    at::Tensor scores = at::matmul(qg, kk).to(at::kFloat) * scale;
    scores = scores.view({b, kvh, group, t, t})
                 .masked_fill(blocked, -std::numeric_limits<float>::infinity());
    at::Tensor probs = at::softmax(scores, -1)
                           .to(vv.scalar_type())
                           .view({b, kvh, group * t, t});
    at::Tensor attn = at::matmul(probs, vv)
                          .view({b, kvh, group, t, hd})
                          .permute({0, 3, 1, 2, 4})
                          .reshape({n, kvh * group * hd});
    x = x + at::linear(attn, w.o_proj);
    x = x +
        SwiGluMlp(RmsNorm(x, w.post_attention_layernorm, c.rms_norm_eps), w);
    for (size_t f = 0; f < feature_layer_ids.size(); ++f) {
      if (feature_layer_ids[f] == l) feats[f] = x;
    }
  }
  if (features != nullptr) {
    *features =
        feats.empty() ? at::Tensor() : at::cat(feats, -1).view({b, t, -1});
  }
  return RmsNorm(x, final_norm_, c.rms_norm_eps).view({b, t, c.hidden_size});
}

at::Tensor TrainableTarget::Logits(const at::Tensor& hidden) const {
  return at::linear(hidden, lm_head_).to(at::kFloat);
}

absl::Status TrainableTarget::Export(
    const std::string& dir, at::ScalarType dtype,
    const std::map<std::string, std::string>& extra_files) const {
  Qwen3Config c = config_;
  c.dtype = dtype == at::kBFloat16 ? "bfloat16"
            : dtype == at::kHalf   ? "float16"
                                   : "float32";
  return ExportCheckpoint(dir, params_, TargetCheckpointLayout(c), dtype,
                          Qwen3ConfigToJson(c), extra_files);
}

// --------------------------------------------------------------------------
// Drafter

absl::StatusOr<TrainableDrafter> TrainableDrafter::Init(
    const DrafterConfig& config, uint64_t seed) {
  TrainableDrafter d;
  d.config_ = config;
  ASSIGN_OR_RETURN(d.params_,
                   InitParameters(DrafterCheckpointLayout(config),
                                  config.layers.num_hidden_layers, seed));
  RETURN_IF_ERROR(d.BindViews());
  return d;
}

absl::StatusOr<TrainableDrafter> TrainableDrafter::Load(
    const std::string& dir) {
  TrainableDrafter d;
  ASSIGN_OR_RETURN(d.config_, LoadDrafterConfig(dir));
  ASSIGN_OR_RETURN(auto archive, WeightArchive::OpenDirectory(dir));
  ASSIGN_OR_RETURN(
      d.params_, LoadParameters(*archive, DrafterCheckpointLayout(d.config_)));
  RETURN_IF_ERROR(d.BindViews());
  return d;
}

absl::StatusOr<TrainableDrafter> TrainableDrafter::Grow(
    const TrainableDrafter& from, int num_layers, uint64_t seed) {
  const int old_layers = from.config_.layers.num_hidden_layers;
  if (num_layers < old_layers) {
    return absl::InvalidArgumentError(absl::StrCat("cannot grow a ", old_layers,
                                                   "-layer drafter to ",
                                                   num_layers, " layers"));
  }
  DrafterConfig config = from.config_;
  config.layers.num_hidden_layers = num_layers;
  ASSIGN_OR_RETURN(TrainableDrafter d, Init(config, seed));
  RETURN_IF_ERROR(SpreadLayers(from.params_, old_layers,
                               DrafterLayerTensorNames, config.layers,
                               d.params_, "drafter"));
  return d;
}

absl::Status TrainableDrafter::BindViews() {
  const NamedTensors m = ByName(params_);
  ASSIGN_OR_RETURN(fc_, FindTensor(m, kDrafterFcWeight));
  ASSIGN_OR_RETURN(hidden_norm_, FindTensor(m, kDrafterHiddenNormWeight));
  ASSIGN_OR_RETURN(final_norm_, FindTensor(m, kDrafterNormWeight));
  layers_.clear();
  for (int l = 0; l < config_.layers.num_hidden_layers; ++l) {
    ASSIGN_OR_RETURN(DecoderLayerWeights w,
                     BindDecoderLayer(m, DrafterLayerTensorNames(l)));
    layers_.push_back(std::move(w));
  }
  const Qwen3Config& c = config_.layers;
  return GuardTorch([&] {
    rotary_ = Rotary(c.head_dim, c.rope_theta, c10::Device(c10::kCPU));
  });
}

DrafterContext TrainableDrafter::ProjectContext(
    const at::Tensor& features) const {
  const Qwen3Config& c = config_.layers;
  const int64_t s = features.size(0), t = features.size(1), n = s * t;
  const int64_t kvh = c.num_key_value_heads, hd = c.head_dim;
  at::Tensor f = features.reshape({n, features.size(2)}).to(at::kFloat);
  // ctx = hidden_norm(fc(features)); no input_layernorm on the context
  // (DFlash), each layer projects the same fused vector.
  at::Tensor ctx = RmsNorm(at::linear(f, fc_), hidden_norm_, c.rms_norm_eps);
  at::Tensor cos, sin;
  rotary_.Tables(TiledPositions(s, t), ctx.scalar_type(), &cos, &sin);
  DrafterContext out;
  for (const DecoderLayerWeights& w : layers_) {
    at::Tensor k = NormAndRotateHeads(at::linear(ctx, w.k_proj), kvh, hd,
                                      w.k_norm, c.rms_norm_eps, cos, sin);
    out.keys.push_back(k.view({s, t, kvh, hd}).permute({0, 2, 1, 3}));
    out.values.push_back(
        at::linear(ctx, w.v_proj).view({s, t, kvh, hd}).permute({0, 2, 1, 3}));
  }
  return out;
}

namespace {

// Adds one layer's attention mass on block keys, `p_blk` [S, kv, NB,
// group * W, W], averaged over its heads and divided by `layers`, to
// `*share` [S, NB, W] (started at zero when undefined).
void AddBlockShare(const at::Tensor& p_blk, int64_t group, size_t layers,
                   at::Tensor* share) {
  at::NoGradGuard no_grad;
  const int64_t s = p_blk.size(0), kvh = p_blk.size(1), nb = p_blk.size(2);
  const int64_t w = p_blk.size(4);
  at::Tensor layer = p_blk.detach()
                         .sum(-1)
                         .view({s, kvh, nb, group, w})
                         .mean(at::IntArrayRef{1, 3}) /
                     static_cast<double>(layers);
  *share = share->defined() ? *share + layer : layer;
}

}  // namespace

at::Tensor TrainableDrafter::BlockLogits(const DrafterContext& context,
                                         const at::Tensor& tokens,
                                         const at::Tensor& anchors, bool causal,
                                         const at::Tensor& embed_tokens,
                                         const at::Tensor& lm_head,
                                         at::Tensor* block_share) const {
  const Qwen3Config& c = config_.layers;
  const int64_t s = tokens.size(0), nb = tokens.size(1), w = tokens.size(2);
  const int64_t n = s * nb * w;
  const int64_t kvh = c.num_key_value_heads, hd = c.head_dim;
  const int64_t group = c.num_attention_heads / c.num_key_value_heads;
  const int64_t t = context.keys.empty() ? 0 : context.keys[0].size(2);
  auto long_opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor slot = at::arange(w, long_opts);
  at::Tensor positions = (anchors.unsqueeze(-1) + slot).reshape({n});
  at::Tensor x =
      at::embedding(embed_tokens, tokens.reshape({n})).to(at::kFloat);
  at::Tensor cos, sin;
  rotary_.Tables(positions, x.scalar_type(), &cos, &sin);
  // Context key j is visible to a block iff j < anchor: [S, 1, NB, 1, T].
  at::Tensor ctx_blocked =
      (at::arange(t, long_opts).view({1, 1, t}) >= anchors.unsqueeze(-1))
          .view({s, 1, nb, 1, t});
  // Inside the block: nothing masked, or key b hidden from query i iff b > i.
  at::Tensor blk_blocked;
  if (causal) {
    blk_blocked = (slot.view({1, w}) > slot.view({w, 1}))
                      .repeat({group, 1})
                      .view({1, 1, 1, group * w, w});
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (block_share) *block_share = at::Tensor();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const DecoderLayerWeights& lw = layers_[l];
    at::Tensor h = RmsNorm(x, lw.input_layernorm, c.rms_norm_eps);
    at::Tensor q =
        NormAndRotateHeads(at::linear(h, lw.q_proj), c.num_attention_heads, hd,
                           lw.q_norm, c.rms_norm_eps, cos, sin)
            .view({s, nb, w, kvh, group, hd});
    at::Tensor kb = NormAndRotateHeads(at::linear(h, lw.k_proj), kvh, hd,
                                       lw.k_norm, c.rms_norm_eps, cos, sin)
                        .view({s, nb, w, kvh, hd});
    at::Tensor vb = at::linear(h, lw.v_proj).view({s, nb, w, kvh, hd});
    // Queries grouped as [S, kv, NB, group * W, hd] (query head = kv * group
    // + g, as in the engine).
    at::Tensor qg =
        q.permute({0, 3, 1, 4, 2, 5}).reshape({s, kvh, nb, group * w, hd});
    // Scores against the context: [S, kv, NB, group * W, T].
    at::Tensor sc_ctx = at::matmul(qg.reshape({s, kvh, nb * group * w, hd}),
                                   context.keys[l].transpose(2, 3))
                            .view({s, kvh, nb, group * w, t});
    // Scores against the block's own keys: [S, kv, NB, group * W, W].
    at::Tensor sc_blk = at::matmul(qg, kb.permute({0, 3, 1, 4, 2}));
    at::Tensor scores = at::cat({sc_ctx, sc_blk}, -1).to(at::kFloat) * scale;
    at::Tensor blocked = ctx_blocked.expand({s, kvh, nb, group * w, t});
    if (causal) {
      blocked = at::cat(
          {blocked, blk_blocked.expand({s, kvh, nb, group * w, w})}, -1);
    } else {
      blocked =
          at::cat({blocked, at::zeros({s, kvh, nb, group * w, w},
                                      at::TensorOptions().dtype(at::kBool))},
                  -1);
    }
    at::Tensor probs = at::softmax(scores.masked_fill(blocked, neg_inf), -1);
    at::Tensor p_ctx = probs.narrow(-1, 0, t);
    at::Tensor p_blk = probs.narrow(-1, t, w);
    if (block_share) AddBlockShare(p_blk, group, layers_.size(), block_share);
    at::Tensor out =
        at::matmul(p_ctx.reshape({s, kvh, nb * group * w, t}),
                   context.values[l])
            .view({s, kvh, nb, group * w, hd}) +
        at::matmul(p_blk, vb.permute({0, 3, 1, 2, 4}));  // [S, kv, NB, gW, hd]
    at::Tensor attn = out.view({s, kvh, nb, group, w, hd})
                          .permute({0, 2, 4, 1, 3, 5})
                          .reshape({n, kvh * group * hd});
    x = x + at::linear(attn, lw.o_proj);
    x = x +
        SwiGluMlp(RmsNorm(x, lw.post_attention_layernorm, c.rms_norm_eps), lw);
  }
  at::Tensor rows = x.view({s, nb, w, c.hidden_size}).narrow(2, 1, w - 1);
  return at::linear(RmsNorm(rows, final_norm_, c.rms_norm_eps), lm_head)
      .to(at::kFloat);
}

absl::Status TrainableDrafter::Export(
    const std::string& dir, at::ScalarType dtype,
    const std::map<std::string, std::string>& extra_files) const {
  DrafterConfig d = config_;
  d.layers.dtype = dtype == at::kBFloat16 ? "bfloat16"
                   : dtype == at::kHalf   ? "float16"
                                          : "float32";
  return ExportCheckpoint(dir, params_, DrafterCheckpointLayout(d), dtype,
                          DrafterConfigToJson(d), extra_files);
}

at::Tensor AddSeedTrust(const at::Tensor& logits,
                        const at::Tensor& seeded_input, int64_t mask_id,
                        double bonus) {
  if (bonus <= 0) return logits;
  const at::Tensor seed = seeded_input.narrow(-1, 1, seeded_input.size(-1) - 1);
  const at::Tensor seeded = seed.ne(mask_id);
  const at::Tensor at_seed = at::zeros_like(logits).scatter_(
      -1, at::where(seeded, seed, at::zeros_like(seed)).unsqueeze(-1),
      (seeded.to(logits.scalar_type()) * bonus).unsqueeze(-1));
  at::Tensor keep;
  {
    at::NoGradGuard no_grad;
    // A seeded slot that, with the bonus, chooses another token; the
    // slots after the block's first such miss get no bonus.
    const at::Tensor miss = (logits.detach() + at_seed)
                                .argmax(-1)
                                .ne(seed)
                                .logical_and(seeded)
                                .to(at::kLong);
    keep =
        (miss.cumsum(-1) - miss).eq(0).unsqueeze(-1).to(logits.scalar_type());
  }
  return logits + at_seed * keep;
}

}  // namespace dedit::training
