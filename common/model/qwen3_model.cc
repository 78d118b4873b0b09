#include "common/model/qwen3_model.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/base/checkpoint_layout.h"
#include "common/base/status.h"
#include "common/model/checkpoint_weights.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/packed_attention.h"
#include "common/model/torch_status.h"

namespace dedit {
namespace {

// The layout of the target in `archive` (common/base/checkpoint_layout.h). A
// tied checkpoint usually omits lm_head; an untied one must have it, which gets
// its own message because the fix is in config.json or the export.
absl::StatusOr<std::vector<CheckpointTensor>> TargetLayout(
    const Qwen3Config& c, const WeightArchive& archive) {
  if (!c.tie_word_embeddings && !archive.Contains(kLmHeadWeight)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kLmHeadWeight, " missing and tie_word_embeddings is false"));
  }
  return TargetCheckpointLayout(c, archive);
}

// Takes the embedding and the head (the embedding itself when the
// checkpoint has no lm_head) out of loaded target tensors.
absl::Status TakeEmbeddingAndHead(const NamedTensors& weights,
                                  at::Tensor* embed, at::Tensor* head) {
  ASSIGN_OR_RETURN(*embed, FindTensor(weights, kEmbedTokensWeight));
  *head = *embed;
  if (weights.count(kLmHeadWeight)) {
    ASSIGN_OR_RETURN(*head, FindTensor(weights, kLmHeadWeight));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Qwen3Model>> Qwen3Model::Load(
    const std::string& dir, const Options& options) {
  ASSIGN_OR_RETURN(Qwen3Config config, LoadQwen3Config(dir));
  ASSIGN_OR_RETURN(auto archive, WeightArchive::OpenDirectory(dir));
  auto model = FromArchive(config, *archive, options);
  if (!model.ok()) return Annotate(model.status(), dir);
  return model;
}

absl::StatusOr<std::unique_ptr<Qwen3Model>> Qwen3Model::FromArchive(
    const Qwen3Config& config, const WeightArchive& archive,
    const Options& options) {
  for (int id : options.feature_layer_ids) {
    if (id < 0 || id >= config.num_hidden_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature layer ", id, " outside the target's ",
                       config.num_hidden_layers, " layers"));
    }
  }
  std::unique_ptr<Qwen3Model> m(new Qwen3Model(config, options));
  ASSIGN_OR_RETURN(const std::vector<CheckpointTensor> layout,
                   TargetLayout(config, archive));
  ASSIGN_OR_RETURN(
      const NamedTensors weights,
      LoadCheckpointTensors(archive, layout, options.dtype, options.device));
  at::Tensor lm_head;
  RETURN_IF_ERROR(TakeEmbeddingAndHead(weights, &m->embed_tokens_, &lm_head));
  ASSIGN_OR_RETURN(m->final_norm_, FindTensor(weights, kTargetNormWeight));
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    ASSIGN_OR_RETURN(DecoderLayerWeights w,
                     BindDecoderLayer(weights, TargetLayerTensorNames(l)));
    m->layers_.push_back(std::move(w));
  }
  const c10::Device dev = options.device;
  ASSIGN_OR_RETURN(const at::ScalarType kv_dtype,
                   KvPoolDtype(options.dtype, dev, config.head_dim));
  RETURN_IF_ERROR(GuardTorch([&] {
    for (DecoderLayerWeights& w : m->layers_) PackDecoderLayer(config, &w);
    m->head_ = OutputHead::Pack(lm_head);
    m->rotary_ = Rotary(config.head_dim, config.rope_theta, dev, options.dtype);
    m->rotary_.CacheTables(config.max_position_embeddings, options.dtype);
    KvPool::Shape shape;
    shape.num_layers = config.num_hidden_layers;
    shape.kv_heads = config.num_key_value_heads;
    shape.head_dim = config.head_dim;
    shape.max_tokens = config.max_position_embeddings;
    shape.bf16_row_kernel = Bf16RowKernelPool(kv_dtype, options.dtype, dev);
    m->pool_ = std::make_unique<KvPool>(
        shape, kv_dtype, dev, options.initial_kv_slots, options.max_sequences);
  }));
  return m;
}

absl::Status Qwen3Model::AddSequence(SequenceId id) {
  absl::Status status;
  RETURN_IF_ERROR(GuardTorch([&] { status = pool_->Add(id); }));
  return status;
}

absl::Status Qwen3Model::RemoveSequence(SequenceId id) {
  absl::Status status;
  RETURN_IF_ERROR(GuardTorch([&] { status = pool_->Remove(id); }));
  return status;
}

absl::StatusOr<int64_t> Qwen3Model::Length(SequenceId id) const {
  if (!pool_->Contains(id)) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
  }
  return pool_->Length(id);
}

absl::Status Qwen3Model::Truncate(SequenceId id, int64_t length) {
  if (!pool_->Contains(id)) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
  }
  if (length < 0 || length > pool_->Length(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot truncate sequence ", id, " of length ",
                     pool_->Length(id), " to ", length));
  }
  pool_->SetLength(id, length);
  return absl::OkStatus();
}

int64_t Qwen3Model::cached_tokens() const { return pool_->total_length(); }

int64_t Qwen3Model::cache_bytes() const { return pool_->nbytes(); }

int64_t Qwen3Model::cache_used_bytes() const { return pool_->used_bytes(); }

absl::Status Qwen3Model::ParkSequence(SequenceId id) {
  absl::Status status;
  RETURN_IF_ERROR(GuardTorch([&] { status = pool_->Park(id); }));
  return status;
}

int64_t Qwen3Model::panel_bytes() const {
  int64_t bytes = head_.panels == nullptr ? 0 : head_.panels->bytes();
  for (const DecoderLayerWeights& w : layers_) {
    for (const auto* p : {&w.qkv_p, &w.o_p, &w.gate_up_p, &w.down_p}) {
      if (*p != nullptr) bytes += (*p)->bytes();
    }
  }
  return bytes;
}

absl::Status Qwen3Model::ValidateSegments(
    const std::vector<TargetSegment>& segments) const {
  std::unordered_set<SequenceId> seen;
  for (const TargetSegment& s : segments) {
    if (!pool_->Contains(s.sequence)) {
      return absl::NotFoundError(absl::StrCat("unknown sequence ", s.sequence));
    }
    if (!seen.insert(s.sequence).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s.sequence, " appears twice in one forward"));
    }
    if (s.tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty segment for sequence ", s.sequence));
    }
    if (s.start != pool_->Length(s.sequence)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "segment of sequence ", s.sequence, " starts at ", s.start,
          " but its cache holds ", pool_->Length(s.sequence), " tokens"));
    }
    if (s.start + static_cast<int64_t>(s.tokens.size()) >
        config_.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s.sequence, " would exceed the context limit of ",
          config_.max_position_embeddings, " tokens"));
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", t, " outside the vocabulary of ", config_.vocab_size));
      }
    }
    for (int r : s.logit_rows) {
      if (r < 0 || r >= static_cast<int>(s.tokens.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("logit row ", r, " outside the segment"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TargetForwardResult> Qwen3Model::Forward(
    const std::vector<TargetSegment>& segments) {
  // No autograd bookkeeping on the model thread (docs/ARCHITECTURE.md §7).
  c10::InferenceMode inference_mode;
  RETURN_IF_ERROR(ValidateSegments(segments));
  if (segments.empty()) return TargetForwardResult{};
  // Parked sequences back into slots before any slot index is taken.
  absl::Status resident;
  RETURN_IF_ERROR(GuardTorch([&] {
    for (const TargetSegment& s : segments) {
      resident = pool_->MakeResident(s.sequence);
      if (!resident.ok()) return;
    }
  }));
  RETURN_IF_ERROR(resident);
  return GuardTorch([&] { return RunForward(segments); });
}

TargetForwardResult Qwen3Model::RunForward(
    const std::vector<TargetSegment>& segments) {
  const Qwen3Config& c = config_;
  const c10::Device dev = options_.device;
  TargetForwardResult result;

  std::vector<int64_t> ids, positions, logit_index;
  std::vector<AttentionSegment> attention_segments;
  int64_t longest = 0;
  for (const TargetSegment& s : segments) {
    longest = std::max<int64_t>(
        longest, s.start + static_cast<int64_t>(s.tokens.size()));
  }
  pool_->Reserve(longest);  // before any slot index is taken
  for (const TargetSegment& s : segments) {
    const int64_t base = static_cast<int64_t>(ids.size());
    const int64_t len = static_cast<int64_t>(s.tokens.size());
    result.token_offsets.push_back(base);
    result.logit_offsets.push_back(static_cast<int64_t>(logit_index.size()));
    for (int64_t i = 0; i < len; ++i) {
      ids.push_back(s.tokens[i]);
      positions.push_back(s.start + i);
    }
    for (int r : s.logit_rows) logit_index.push_back(base + r);
    attention_segments.push_back(
        {pool_->Slot(s.sequence), s.start, len, /*causal=*/true});
    pool_->MarkWritten(s.sequence, s.start + len);
  }
  auto long_opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor ids_t = OnDevice(at::tensor(ids, long_opts), dev);
  at::Tensor pos_t = OnDevice(at::tensor(positions, long_opts), dev);
  const PackedAttention attention(attention_segments, *pool_,
                                  c.num_attention_heads);

  at::Tensor x = at::embedding(embed_tokens_, ids_t);
  at::Tensor cos, sin;
  rotary_.HeadTables(pos_t, options_.dtype, &cos, &sin);

  // Features may name a layer twice; keep one tensor per requested id.
  std::vector<at::Tensor> features(options_.feature_layer_ids.size());
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    // A profiler scope: dedit-engine-bench counts the ops of one layer.
    RECORD_USER_SCOPE("dedit::decoder_layer");
    const DecoderLayerWeights& w = layers_[l];
    x = DecoderLayerForward(x, w, c, rotary_, cos, sin, attention, pool_.get(),
                            l);
    for (size_t f = 0; f < features.size(); ++f) {
      if (options_.feature_layer_ids[f] == l) features[f] = x;
    }
  }
  if (!features.empty()) result.features = at::cat(features, -1);
  if (!logit_index.empty()) {
    // Every row (a verify block, a decode batch) needs no gather.
    bool every_row = static_cast<int64_t>(logit_index.size()) == x.size(0);
    for (size_t i = 0; every_row && i < logit_index.size(); ++i) {
      every_row = logit_index[i] == static_cast<int64_t>(i);
    }
    at::Tensor rows =
        every_row ? x
                  : x.index_select(
                        0, OnDevice(at::tensor(logit_index, long_opts), dev));
    result.logits =
        AsFloat(head_.Logits(RmsNorm(rows, final_norm_, c.rms_norm_eps)));
    at::Tensor greedy =
        result.logits.argmax(-1).to(at::kCPU, at::kInt).contiguous();
    result.greedy.assign(greedy.data_ptr<int32_t>(),
                         greedy.data_ptr<int32_t>() + greedy.numel());
  }
  for (const TargetSegment& s : segments) {
    pool_->SetLength(s.sequence,
                     s.start + static_cast<int64_t>(s.tokens.size()));
  }
  return result;
}

absl::Status LoadTargetEmbeddings(const std::string& target_dir,
                                  at::ScalarType dtype, c10::Device device,
                                  at::Tensor* embed_tokens,
                                  at::Tensor* lm_head) {
  ASSIGN_OR_RETURN(Qwen3Config config, LoadQwen3Config(target_dir));
  ASSIGN_OR_RETURN(auto archive, WeightArchive::OpenDirectory(target_dir));
  // Only the embedding and the head: a drafter host may hold a target folder
  // trimmed to those two.
  ASSIGN_OR_RETURN(std::vector<CheckpointTensor> layout,
                   TargetLayout(config, *archive));
  std::vector<CheckpointTensor> shared;
  for (CheckpointTensor& t : layout) {
    if (t.role == TensorRole::kEmbedding || t.role == TensorRole::kLmHead) {
      shared.push_back(std::move(t));
    }
  }
  ASSIGN_OR_RETURN(const NamedTensors weights,
                   LoadCheckpointTensors(*archive, shared, dtype, device));
  return TakeEmbeddingAndHead(weights, embed_tokens, lm_head);
}

}  // namespace dedit
