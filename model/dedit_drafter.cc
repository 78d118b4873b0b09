#include "model/dedit_drafter.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "base/checkpoint_layout.h"
#include "base/status.h"
#include "model/checkpoint_weights.h"
#include "model/torch_status.h"

namespace dedit {

absl::StatusOr<std::unique_ptr<DEditDrafter>> DEditDrafter::Load(
    const std::string& dir, at::Tensor embed_tokens, at::Tensor lm_head,
    const Options& options) {
  ASSIGN_OR_RETURN(DrafterConfig config, LoadDrafterConfig(dir));
  ASSIGN_OR_RETURN(auto archive, WeightArchive::OpenDirectory(dir));
  auto drafter = FromArchive(config, *archive, std::move(embed_tokens),
                             std::move(lm_head), options);
  if (!drafter.ok()) return Annotate(drafter.status(), dir);
  return drafter;
}

absl::StatusOr<std::unique_ptr<DEditDrafter>> DEditDrafter::FromArchive(
    const DrafterConfig& config, const WeightArchive& archive,
    at::Tensor embed_tokens, at::Tensor lm_head, const Options& options) {
  const Qwen3Config& c = config.layers;
  if (!embed_tokens.defined() || !lm_head.defined() ||
      embed_tokens.dim() != 2 || lm_head.dim() != 2 ||
      embed_tokens.size(1) != c.hidden_size ||
      lm_head.size(1) != c.hidden_size ||
      embed_tokens.size(0) != lm_head.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target embedding/lm_head do not fit a drafter of hidden size ",
        c.hidden_size));
  }
  if (config.mask_token_id >= embed_tokens.size(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask_token_id ", config.mask_token_id,
                     " outside the target vocabulary"));
  }
  std::unique_ptr<DEditDrafter> d(new DEditDrafter(config, options));
  const at::ScalarType dt = options.dtype;
  const c10::Device dev = options.device;
  RETURN_IF_ERROR(GuardTorch([&] {
    d->embed_tokens_ = embed_tokens.to(dev, dt);
    d->lm_head_ = lm_head.to(dev, dt);
    d->rotary_ = Rotary(c.head_dim, c.rope_theta, dev);
  }));
  ASSIGN_OR_RETURN(
      const NamedTensors weights,
      LoadCheckpointTensors(archive, DrafterCheckpointLayout(config), dt, dev));
  ASSIGN_OR_RETURN(d->fc_, FindTensor(weights, kDrafterFcWeight));
  ASSIGN_OR_RETURN(d->hidden_norm_,
                   FindTensor(weights, kDrafterHiddenNormWeight));
  ASSIGN_OR_RETURN(d->final_norm_, FindTensor(weights, kDrafterNormWeight));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    ASSIGN_OR_RETURN(DecoderLayerWeights w,
                     BindDecoderLayer(weights, DrafterLayerTensorNames(l)));
    d->layers_.push_back(std::move(w));
  }
  return d;
}

absl::Status DEditDrafter::AddSequence(SequenceId id) {
  if (contexts_.count(id)) {
    return absl::AlreadyExistsError(absl::StrCat("sequence ", id, " exists"));
  }
  const Qwen3Config& c = config_.layers;
  return GuardTorch([&] {
    contexts_[id] = std::make_unique<KvCache>(
        c.num_hidden_layers, c.num_key_value_heads, c.head_dim, options_.dtype,
        options_.device, options_.initial_context_capacity);
  });
}

absl::Status DEditDrafter::RemoveSequence(SequenceId id) {
  if (contexts_.erase(id) == 0) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DEditDrafter::ContextLength(SequenceId id) const {
  auto it = contexts_.find(id);
  if (it == contexts_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
  }
  return it->second->length();
}

int64_t DEditDrafter::context_tokens() const {
  int64_t n = 0;
  for (const auto& [id, cache] : contexts_) n += cache->length();
  return n;
}

absl::Status DEditDrafter::AppendContext(SequenceId id, int64_t start,
                                         const at::Tensor& features) {
  auto it = contexts_.find(id);
  if (it == contexts_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
  }
  KvCache& cache = *it->second;
  if (start != cache.length()) {
    return absl::InvalidArgumentError(
        absl::StrCat("context for sequence ", id, " starts at ", start, " but ",
                     cache.length(), " tokens are cached"));
  }
  if (!features.defined() || features.dim() != 2 ||
      features.size(1) != feature_width()) {
    return absl::InvalidArgumentError(
        absl::StrCat("context features must be [n, ", feature_width(), "]"));
  }
  const int64_t n = features.size(0);
  if (n == 0) return absl::OkStatus();
  const Qwen3Config& c = config_.layers;
  c10::InferenceMode inference_mode;
  return GuardTorch([&] {
    at::Tensor f = features.to(options_.device, options_.dtype);
    // ctx = hidden_norm(fc(features)); each layer projects the same fused
    // vector with its own k_proj/v_proj (no input_layernorm: DFlash).
    at::Tensor ctx = RmsNorm(at::linear(f, fc_), hidden_norm_, c.rms_norm_eps);
    at::Tensor pos =
        at::arange(start, start + n, at::TensorOptions().dtype(at::kLong))
            .to(options_.device);
    at::Tensor cos, sin;
    rotary_.Tables(pos, options_.dtype, &cos, &sin);
    cache.Reserve(start + n);
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const DecoderLayerWeights& w = layers_[l];
      at::Tensor k =
          NormAndRotateHeads(at::linear(ctx, w.k_proj), c.num_key_value_heads,
                             c.head_dim, w.k_norm, c.rms_norm_eps, cos, sin);
      at::Tensor v = at::linear(ctx, w.v_proj)
                         .view({n, c.num_key_value_heads, c.head_dim});
      cache.Write(l, start, k, v);
    }
    cache.SetLength(start + n);
  });
}

absl::Status DEditDrafter::ValidateRequests(
    const std::vector<DraftRequest>& requests) const {
  std::unordered_set<SequenceId> seen;
  const int vocab = static_cast<int>(embed_tokens_.size(0));
  for (const DraftRequest& r : requests) {
    auto it = contexts_.find(r.sequence);
    if (it == contexts_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown sequence ", r.sequence));
    }
    if (!seen.insert(r.sequence).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", r.sequence, " drafted twice in one call"));
    }
    if (r.start != it->second->length()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "draft for sequence ", r.sequence, " at ", r.start, " but ",
          it->second->length(), " context tokens are cached"));
    }
    if (r.window < 2 || r.window > config_.block_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("window ", r.window, " outside [2, ", config_.block_size,
                       "] (the drafter's block size)"));
    }
    if (r.passes < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("passes must be >= 1, got ", r.passes));
    }
    if (r.bonus < 0 || r.bonus >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("bonus token ", r.bonus, " outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<DraftResult>> DEditDrafter::Draft(
    const std::vector<DraftRequest>& requests) {
  // No autograd bookkeeping on the model thread (docs/ARCHITECTURE.md §7).
  c10::InferenceMode inference_mode;
  RETURN_IF_ERROR(ValidateRequests(requests));
  return GuardTorch([&] { return RunDraft(requests); });
}

std::vector<DraftResult> DEditDrafter::RunDraft(
    const std::vector<DraftRequest>& requests) {
  std::vector<DraftResult> results(requests.size());
  int max_passes = 0;
  for (const DraftRequest& r : requests)
    max_passes = std::max(max_passes, r.passes);
  for (int p = 0; p < max_passes; ++p) {
    std::vector<size_t> active;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].passes > p) active.push_back(i);
    }
    RunPass(requests, active, &results);
  }
  return results;
}

void DEditDrafter::RunPass(const std::vector<DraftRequest>& requests,
                           const std::vector<size_t>& active,
                           std::vector<DraftResult>* results) {
  const Qwen3Config& c = config_.layers;
  const c10::Device dev = options_.device;
  // Block inputs: [bonus, MASK x (W-1)] for P1, [bonus, y(k-1)] for edits.
  std::vector<int64_t> ids, positions, offsets, head_rows;
  for (size_t i : active) {
    const DraftRequest& r = requests[i];
    const DraftResult& prev = (*results)[i];
    offsets.push_back(static_cast<int64_t>(ids.size()));
    for (int j = 0; j < r.window; ++j) {
      int64_t token = r.bonus;
      if (j > 0) {
        token = prev.passes.empty() ? config_.mask_token_id
                                    : prev.passes.back().tokens[j - 1];
        head_rows.push_back(static_cast<int64_t>(ids.size()));
      }
      ids.push_back(token);
      positions.push_back(r.start + j);
    }
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  auto long_opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor x =
      at::embedding(embed_tokens_, at::tensor(ids, long_opts).to(dev));
  at::Tensor cos, sin;
  rotary_.Tables(at::tensor(positions, long_opts).to(dev), options_.dtype, &cos,
                 &sin);
  const int64_t q_width = int64_t{c.num_attention_heads} * c.head_dim;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const DecoderLayerWeights& w = layers_[l];
    auto [q, k, v] = ProjectQkv(x, w, c, cos, sin);
    at::Tensor attn = at::empty({n, q_width}, x.options());
    for (size_t a = 0; a < active.size(); ++a) {
      const DraftRequest& r = requests[active[a]];
      const KvCache& ctx = *contexts_.at(r.sequence);
      const int64_t off = offsets[a];
      // Keys/values = [context ; block]; the block's K/V is transient.
      at::Tensor keys = at::cat(
          {ctx.Keys(l, r.start), k.narrow(0, off, r.window).transpose(0, 1)},
          1);
      at::Tensor values = at::cat(
          {ctx.Values(l, r.start), v.narrow(0, off, r.window).transpose(0, 1)},
          1);
      attn.narrow(0, off, r.window)
          .copy_(GroupedAttention(q.narrow(0, off, r.window), keys, values,
                                  /*causal_offset=*/-1,
                                  causal_editor_ ? r.start : -1));
    }
    x = FinishDecoderLayer(x, attn, w, c);
  }
  at::Tensor rows = x.index_select(0, at::tensor(head_rows, long_opts).to(dev));
  at::Tensor logits =
      at::linear(RmsNorm(rows, final_norm_, c.rms_norm_eps), lm_head_)
          .to(at::kFloat);
  // Confidence = max softmax probability = 1 / sum(exp(l - max)).
  auto [max_logit, argmax] = logits.max(-1);
  at::Tensor conf =
      at::exp(logits - max_logit.unsqueeze(1)).sum(-1).reciprocal();
  at::Tensor tokens_cpu = argmax.to(at::kCPU, at::kInt).contiguous();
  at::Tensor conf_cpu = conf.to(at::kCPU).contiguous();
  const int32_t* tok = tokens_cpu.data_ptr<int32_t>();
  const float* cf = conf_cpu.data_ptr<float>();
  int64_t row = 0;
  for (size_t i : active) {
    const int slots = requests[i].window - 1;
    DraftPass pass;
    pass.tokens.assign(tok + row, tok + row + slots);
    pass.confidences.assign(cf + row, cf + row + slots);
    row += slots;
    (*results)[i].passes.push_back(std::move(pass));
  }
}

}  // namespace dedit
