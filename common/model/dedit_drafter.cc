#include "common/model/dedit_drafter.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/base/checkpoint_layout.h"
#include "common/base/status.h"
#include "common/engine/ngram_drafter.h"
#include "common/model/checkpoint_weights.h"
#include "common/model/cpu/cpu_kernels.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/cpu/cpu_product_pool.h"
#include "common/model/packed_attention.h"
#include "common/model/torch_status.h"

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
    d->head_ = OutputHead::Pack(lm_head.to(dev, dt));
    d->rotary_ = Rotary(c.head_dim, c.rope_theta, dev, dt);
    d->rotary_.CacheTables(c.max_position_embeddings, dt);
  }));
  ASSIGN_OR_RETURN(
      const NamedTensors weights,
      LoadCheckpointTensors(archive, DrafterCheckpointLayout(config), dt, dev));
  ASSIGN_OR_RETURN(const at::Tensor fc, FindTensor(weights, kDrafterFcWeight));
  ASSIGN_OR_RETURN(d->hidden_norm_,
                   FindTensor(weights, kDrafterHiddenNormWeight));
  ASSIGN_OR_RETURN(d->final_norm_, FindTensor(weights, kDrafterNormWeight));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    ASSIGN_OR_RETURN(DecoderLayerWeights w,
                     BindDecoderLayer(weights, DrafterLayerTensorNames(l)));
    d->layers_.push_back(std::move(w));
  }
  ASSIGN_OR_RETURN(const at::ScalarType kv_dtype,
                   KvPoolDtype(dt, dev, c.head_dim));
  RETURN_IF_ERROR(GuardTorch([&] {
    d->fc_ = OutputHead::Pack(fc);
    for (DecoderLayerWeights& w : d->layers_) {
      PackDecoderLayer(c, &w);
      d->context_kv_.push_back(OutputHead::Pack(at::cat({w.k_proj, w.v_proj})));
    }
    KvPool::Shape shape;
    shape.num_layers = c.num_hidden_layers;
    shape.kv_heads = c.num_key_value_heads;
    shape.head_dim = c.head_dim;
    shape.max_tokens =
        (options.max_context_tokens > 0 ? options.max_context_tokens
                                        : int64_t{c.max_position_embeddings}) +
        config.block_size;
    shape.bf16_row_kernel = Bf16RowKernelPool(kv_dtype, dt, dev);
    d->pool_ = std::make_unique<KvPool>(shape, kv_dtype, dev,
                                        options.initial_context_slots,
                                        options.max_sequences);
  }));
  return d;
}

absl::Status DEditDrafter::AddSequence(SequenceId id) {
  absl::Status status;
  RETURN_IF_ERROR(GuardTorch([&] { status = pool_->Add(id); }));
  return status;
}

absl::Status DEditDrafter::ParkSequence(SequenceId id) {
  absl::Status status;
  RETURN_IF_ERROR(GuardTorch([&] { status = pool_->Park(id); }));
  return status;
}

absl::Status DEditDrafter::MakeResident(const std::vector<SequenceId>& ids) {
  absl::Status status;
  RETURN_IF_ERROR(GuardTorch([&] {
    for (SequenceId id : ids) {
      status = pool_->MakeResident(id);
      if (!status.ok()) return;
    }
  }));
  return status;
}

int64_t DEditDrafter::context_bytes() const { return pool_->nbytes(); }

int64_t DEditDrafter::context_used_bytes() const { return pool_->used_bytes(); }

absl::Status DEditDrafter::RemoveSequence(SequenceId id) {
  absl::Status status;
  RETURN_IF_ERROR(GuardTorch([&] { status = pool_->Remove(id); }));
  return status;
}

absl::StatusOr<int64_t> DEditDrafter::ContextLength(SequenceId id) const {
  if (!pool_->Contains(id)) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
  }
  return pool_->Length(id);
}

int64_t DEditDrafter::context_tokens() const { return pool_->total_length(); }

int64_t DEditDrafter::max_context_tokens() const {
  return pool_->shape().max_tokens - config_.block_size;
}

absl::Status DEditDrafter::TruncateContext(SequenceId id, int64_t length) {
  if (!pool_->Contains(id)) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
  }
  if (length < 0 || length > pool_->Length(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot truncate the context of sequence ", id,
                     " of length ", pool_->Length(id), " to ", length));
  }
  pool_->SetLength(id, length);
  return absl::OkStatus();
}

absl::Status DEditDrafter::AppendContext(SequenceId id, int64_t start,
                                         const at::Tensor& features) {
  return AppendContexts({{id, start, features}});
}

absl::Status DEditDrafter::CheckContextChunk(const ContextChunk& chunk,
                                             int64_t cached) const {
  const SequenceId id = chunk.sequence;
  if (chunk.start != cached) {
    return absl::InvalidArgumentError(
        absl::StrCat("context for sequence ", id, " starts at ", chunk.start,
                     " but ", cached, " tokens are cached"));
  }
  const at::Tensor& f = chunk.features;
  if (!f.defined() || f.dim() != 2 || f.size(1) != feature_width()) {
    return absl::InvalidArgumentError(
        absl::StrCat("context features must be [n, ", feature_width(), "]"));
  }
  if (chunk.start + f.size(0) > max_context_tokens()) {
    return absl::OutOfRangeError(absl::StrCat(
        "context for sequence ", id, " would hold ", chunk.start + f.size(0),
        " tokens, past the drafter's limit of ", max_context_tokens()));
  }
  return absl::OkStatus();
}

absl::Status DEditDrafter::AppendContexts(
    const std::vector<ContextChunk>& chunks) {
  // Check every chunk against the context it will extend.
  std::unordered_map<SequenceId, int64_t> ends;
  int64_t rows_total = 0, longest = 0;
  for (const ContextChunk& chunk : chunks) {
    const SequenceId id = chunk.sequence;
    if (!pool_->Contains(id)) {
      return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
    }
    const int64_t end = ends.try_emplace(id, pool_->Length(id)).first->second;
    RETURN_IF_ERROR(CheckContextChunk(chunk, end));
    const int64_t n = chunk.features.size(0);
    ends[id] = chunk.start + n;
    rows_total += n;
    longest = std::max(longest, chunk.start + n);
  }
  if (rows_total == 0) return absl::OkStatus();
  std::vector<SequenceId> ids;
  for (const auto& [id, end] : ends) ids.push_back(id);
  RETURN_IF_ERROR(MakeResident(ids));
  const Qwen3Config& c = config_.layers;
  c10::InferenceMode inference_mode;
  return GuardTorch([&] {
    std::vector<at::Tensor> parts;
    std::vector<int64_t> positions;
    positions.reserve(rows_total);
    for (const ContextChunk& chunk : chunks) {
      const int64_t n = chunk.features.size(0);
      if (n == 0) continue;
      parts.push_back(chunk.features.to(options_.device, options_.dtype));
      for (int64_t p = chunk.start; p < chunk.start + n; ++p) {
        positions.push_back(p);
      }
    }
    const at::Tensor f = parts.size() == 1 ? parts[0] : at::cat(parts);
    pool_->Reserve(longest);  // before any slot index is taken
    std::vector<int64_t> rows;
    for (const ContextChunk& chunk : chunks) {
      const int64_t n = chunk.features.size(0);
      pool_->AppendRows(pool_->Slot(chunk.sequence), chunk.start, n, &rows);
      pool_->MarkWritten(chunk.sequence, chunk.start + n);
    }
    if (CpuContextApplies(f)) {
      AppendContextRowsCpu(f, positions, rows);
      for (const auto& [id, end] : ends) pool_->SetLength(id, end);
      return;
    }
    // ctx = hidden_norm(fc(features)); each layer projects the same fused
    // vector with its own k_proj/v_proj (no input_layernorm: DFlash).
    at::Tensor ctx = RmsNorm(fc_.Logits(f), hidden_norm_, c.rms_norm_eps);
    auto long_opts = at::TensorOptions().dtype(at::kLong);
    at::Tensor cos, sin;
    rotary_.Tables(OnDevice(at::tensor(positions, long_opts), options_.device),
                   options_.dtype, &cos, &sin);
    const at::Tensor flat_rows =
        pool_->shape().bf16_row_kernel
            ? at::Tensor()
            : OnDevice(at::tensor(rows, long_opts), options_.device);
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const DecoderLayerWeights& w = layers_[l];
      const int64_t kv_width = int64_t{c.num_key_value_heads} * c.head_dim;
      const at::Tensor kv = context_kv_[l].Logits(ctx);  // [rows, 2 * kv]
      at::Tensor k = NormAndRotateHeads(kv.narrow(1, 0, kv_width).contiguous(),
                                        c.num_key_value_heads, c.head_dim,
                                        w.k_norm, c.rms_norm_eps, cos, sin);
      at::Tensor v =
          kv.narrow(1, kv_width, kv_width)
              .reshape({rows_total, c.num_key_value_heads, c.head_dim});
      if (pool_->shape().bf16_row_kernel) {
        // The bf16 row kernel's blocked keys are written row by row.
        pool_->WriteRows(l, rows, k.stride(2) == 1 ? k : k.contiguous(),
                         v.stride(2) == 1 ? v : v.contiguous());
      } else {
        pool_->Write(l, flat_rows, k, v);
      }
    }
    for (const auto& [id, end] : ends) pool_->SetLength(id, end);
  });
}

bool DEditDrafter::CpuContextApplies(const at::Tensor& f) const {
  const Qwen3Config& c = config_.layers;
  const int64_t kv_width = int64_t{c.num_key_value_heads} * c.head_dim;
  if (!CpuKernelsApply(f) || f.dim() != 2 || fc_.panels == nullptr ||
      fc_.panels->k() != f.size(1) || fc_.panels->n() != c.hidden_size ||
      !CpuKernelsApply(hidden_norm_) || hidden_norm_.numel() != c.hidden_size ||
      c.head_dim % 2 != 0 || c.head_dim > 512 || !rotary_.HasCachedTables()) {
    return false;
  }
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const CpuPanels* kv = context_kv_[l].panels.get();
    const at::Tensor& norms = layers_[l].qk_norm;
    if (kv == nullptr || kv->k() != c.hidden_size || kv->n() != 2 * kv_width ||
        !CpuKernelsApply(norms) ||
        norms.numel() !=
            int64_t{c.num_attention_heads} * c.head_dim + kv_width) {
      return false;
    }
  }
  return true;
}

void DEditDrafter::AppendContextRowsCpu(const at::Tensor& f,
                                        const std::vector<int64_t>& positions,
                                        const std::vector<int64_t>& rows) {
  const Qwen3Config& c = config_.layers;
  const int64_t n = f.size(0), hidden = c.hidden_size, hd = c.head_dim;
  const int64_t kv_heads = c.num_key_value_heads, kv_width = kv_heads * hd;
  // Scratch rows: fc's output, ctx, one layer's [k | v], its normed and
  // rotated k, and the rows' cos and sin.
  thread_local std::vector<float> scratch;
  const int64_t need = n * (2 * hidden + 3 * kv_width + 2 * hd);
  if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(need);
  float* projected = scratch.data();
  float* ctx = projected + n * hidden;
  float* kv = ctx + n * hidden;
  float* k = kv + n * 2 * kv_width;
  float* cos = k + n * kv_width;
  float* sin = cos + n * hd;
  rotary_.CachedRows(positions, cos, sin);
  CpuProductPool* products = CpuProductPool::ForThisThread();
  fc_.panels->Multiply(f.data_ptr<float>(), n, nullptr, projected, products);
  // RmsNorm(x, w) = RmsNormalize(x) * w, the same fp32 products.
  CpuRmsNormalizeRows(projected, n, hidden, c.rms_norm_eps, ctx);
  const float* norm = hidden_norm_.data_ptr<float>();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < hidden; ++j) ctx[t * hidden + j] *= norm[j];
  }
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    context_kv_[l].panels->Multiply(ctx, n, nullptr, kv, products);
    // The k heads' norm weights follow the q heads' in qk_norm.
    const float* k_norm = layers_[l].qk_norm.data_ptr<float>() +
                          int64_t{c.num_attention_heads} * hd;
    CpuHeadNormRopeRows(kv, n, 2 * kv_width, kv_heads, hd, k_norm,
                        c.rms_norm_eps, cos, sin, k);
    pool_->WriteRows(l, rows, k, kv_width, hd, kv + kv_width, 2 * kv_width, hd);
  }
}

absl::Status DEditDrafter::ValidateRequests(
    const std::vector<DraftRequest>& requests) const {
  std::unordered_set<SequenceId> seen;
  const int vocab = static_cast<int>(embed_tokens_.size(0));
  for (const DraftRequest& r : requests) {
    if (!pool_->Contains(r.sequence)) {
      return absl::NotFoundError(absl::StrCat("unknown sequence ", r.sequence));
    }
    if (!seen.insert(r.sequence).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", r.sequence, " drafted twice in one call"));
    }
    if (r.start != pool_->Length(r.sequence)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "draft for sequence ", r.sequence, " at ", r.start, " but ",
          pool_->Length(r.sequence), " context tokens are cached"));
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
    RETURN_IF_ERROR(CheckDraftSeed(r, vocab));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<DraftResult>> DEditDrafter::Draft(
    const std::vector<DraftRequest>& requests) {
  // No autograd bookkeeping on the model thread (docs/ARCHITECTURE.md §7).
  c10::InferenceMode inference_mode;
  RETURN_IF_ERROR(ValidateRequests(requests));
  std::vector<SequenceId> ids;
  for (const DraftRequest& r : requests) ids.push_back(r.sequence);
  RETURN_IF_ERROR(MakeResident(ids));
  return GuardTorch([&] { return RunDraft(requests); });
}

std::vector<DraftResult> DEditDrafter::RunDraft(
    const std::vector<DraftRequest>& requests) {
  const c10::Device dev = options_.device;
  const int64_t num = static_cast<int64_t>(requests.size());
  int max_passes = 0, max_slots = 0;
  for (const DraftRequest& r : requests) {
    max_passes = std::max(max_passes, r.passes);
    max_slots = std::max(max_slots, r.window - 1);
  }
  // Block inputs live on the device between passes: [bonus, MASK x (W-1)]
  // for P1 (the seed, then MASK, when the request has one), [bonus, y(k-1)]
  // for the edits. `source` = [bonus of each request; the mask token;
  // latest tokens [num, max_slots] flattened, starting as the seeds].
  std::vector<int64_t> source_host(num + 1 + num * max_slots,
                                   config_.mask_token_id);
  for (int64_t i = 0; i < num; ++i) {
    const DraftRequest& r = requests[i];
    source_host[i] = r.bonus;
    std::copy(r.seed.begin(), r.seed.end(),
              source_host.begin() + num + 1 + i * max_slots);
  }
  auto long_opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor source = OnDevice(at::tensor(source_host, long_opts), dev);
  std::vector<std::vector<size_t>> actives;
  std::vector<at::Tensor> pass_tokens, pass_confidences;
  for (int p = 0; p < max_passes; ++p) {
    std::vector<size_t> active;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].passes > p) active.push_back(i);
    }
    // Seeded head rows, their seed tokens, and for each the index (into
    // seed_rows) of its block's first seeded row.
    std::vector<int64_t> gather, positions, head_rows, slots, seed_rows,
        seed_tokens, seed_first;
    int64_t block_first = 0;
    for (size_t i : active) {
      const DraftRequest& r = requests[i];
      for (int j = 0; j < r.window; ++j) {
        if (j == 0) {
          gather.push_back(static_cast<int64_t>(i));
        } else {
          const int64_t slot =
              num + 1 + static_cast<int64_t>(i) * max_slots + (j - 1);
          gather.push_back(slot);
          // Every pass knows the seed: the bonus holds a trusted copy
          // through the edits too, which read only the previous pass.
          if (config_.seed_logit_bonus > 0 &&
              j - 1 < static_cast<int>(r.seed.size())) {
            if (j == 1) block_first = static_cast<int64_t>(seed_rows.size());
            seed_first.push_back(block_first);
            seed_rows.push_back(static_cast<int64_t>(head_rows.size()));
            seed_tokens.push_back(r.seed[j - 1]);
          }
          head_rows.push_back(static_cast<int64_t>(positions.size()));
          slots.push_back(slot - (num + 1));
        }
        positions.push_back(r.start + j);
      }
    }
    at::Tensor ids =
        source.index_select(0, OnDevice(at::tensor(gather, long_opts), dev));
    auto [tokens, confidences] =
        RunPass(requests, active, ids, positions, head_rows,
                SeedSlots{seed_rows, seed_tokens, seed_first},
                /*causal=*/causal_editor_ && p > 0);
    // The next pass reads this one's tokens from the device.
    source.narrow(0, num + 1, num * max_slots)
        .index_copy_(0, OnDevice(at::tensor(slots, long_opts), dev), tokens);
    actives.push_back(std::move(active));
    pass_tokens.push_back(tokens);
    pass_confidences.push_back(confidences);
  }
  // One copy back for every pass.
  at::Tensor tokens_cpu =
      at::cat(pass_tokens).to(at::kCPU, at::kInt).contiguous();
  at::Tensor conf_cpu = at::cat(pass_confidences).to(at::kCPU).contiguous();
  const int32_t* tok = tokens_cpu.data_ptr<int32_t>();
  const float* cf = conf_cpu.data_ptr<float>();
  std::vector<DraftResult> results(requests.size());
  int64_t row = 0;
  for (const std::vector<size_t>& active : actives) {
    for (size_t i : active) {
      const int slots = requests[i].window - 1;
      DraftPass pass;
      pass.tokens.assign(tok + row, tok + row + slots);
      pass.confidences.assign(cf + row, cf + row + slots);
      row += slots;
      results[i].passes.push_back(std::move(pass));
    }
  }
  return results;
}

void DEditDrafter::AddSeedBonus(const SeedSlots& seeds,
                                at::Tensor* logits) const {
  const float bonus = static_cast<float>(config_.seed_logit_bonus);
  if (GetCpuProducts() != CpuProducts::kBlas && CpuKernelsApply(*logits) &&
      logits->dim() == 2) {
    // The same rule in one loop over the seeded rows: the ATen composition
    // below is ~18 small ops, tens of µs a pass on the CPU. Gated like the
    // argmax in RunPass, so that blas products keep the ATen reference
    // (DrafterEquivalenceTest runs both).
    float* lp = logits->data_ptr<float>();
    const int64_t v = logits->size(1);
    bool following = true;
    for (size_t k = 0; k < seeds.rows.size(); ++k) {
      if (seeds.block_first[k] == static_cast<int64_t>(k)) following = true;
      if (!following) continue;
      float* row = lp + seeds.rows[k] * v;
      row[seeds.tokens[k]] += bonus;
      int64_t best = 0;  // the first maximum, as argmax
      for (int64_t t = 1; t < v; ++t) {
        if (row[t] > row[best]) best = t;
      }
      following = best == seeds.tokens[k];
    }
    return;
  }
  const c10::Device dev = options_.device;
  auto long_opts = at::TensorOptions().dtype(at::kLong);
  const at::Tensor rows = OnDevice(at::tensor(seeds.rows, long_opts), dev);
  const at::Tensor tokens = OnDevice(at::tensor(seeds.tokens, long_opts), dev);
  const at::Tensor block_first =
      OnDevice(at::tensor(seeds.block_first, long_opts), dev);
  // What each seeded slot would choose with the bonus.
  at::Tensor biased = logits->index_select(0, rows);
  const at::Tensor seeded_index = at::arange(
      static_cast<int64_t>(seeds.rows.size()), long_opts.device(dev));
  biased.index_put_(
      {seeded_index, tokens},
      at::scalar_tensor(config_.seed_logit_bonus, biased.options()),
      /*accumulate=*/true);
  // A slot keeps the bonus while every seeded slot before it in its block
  // chose the seed's token: misses strictly before it, minus those before
  // its block's first seeded slot, are none.
  const at::Tensor miss = biased.argmax(-1).ne(tokens).to(at::kLong);
  const at::Tensor before = miss.cumsum(0) - miss;
  const at::Tensor following =
      (before - before.index_select(0, block_first)).eq(0);
  logits->index_put_(
      {rows, tokens},
      following.to(logits->scalar_type()) * config_.seed_logit_bonus,
      /*accumulate=*/true);
}

std::pair<at::Tensor, at::Tensor> DEditDrafter::RunPass(
    const std::vector<DraftRequest>& requests,
    const std::vector<size_t>& active, const at::Tensor& ids,
    const std::vector<int64_t>& positions,
    const std::vector<int64_t>& head_rows, const SeedSlots& seeds,
    bool causal) {
  const Qwen3Config& c = config_.layers;
  const c10::Device dev = options_.device;
  int64_t longest = 0;
  for (size_t i : active) {
    longest =
        std::max<int64_t>(longest, requests[i].start + requests[i].window);
  }
  pool_->Reserve(longest);  // before any slot index is taken
  std::vector<AttentionSegment> segments;
  for (size_t i : active) {
    const DraftRequest& r = requests[i];
    // The block attends to the whole context and, bidirectionally (or
    // causally in the causal editor's edit passes), to itself: its K/V is
    // written into the slab past the context, transiently (the length does
    // not move).
    segments.push_back({pool_->Slot(r.sequence), r.start, r.window, causal});
    pool_->MarkWritten(r.sequence, r.start + r.window);
  }
  auto long_opts = at::TensorOptions().dtype(at::kLong);
  const PackedAttention attention(segments, *pool_, c.num_attention_heads);
  at::Tensor x = at::embedding(embed_tokens_, ids);
  at::Tensor cos, sin;
  rotary_.HeadTables(OnDevice(at::tensor(positions, long_opts), dev),
                     options_.dtype, &cos, &sin);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    // A profiler scope: dedit-engine-bench counts the ops of one layer.
    RECORD_USER_SCOPE("dedit::decoder_layer");
    const DecoderLayerWeights& w = layers_[l];
    x = DecoderLayerForward(x, w, c, rotary_, cos, sin, attention, pool_.get(),
                            l);
  }
  at::Tensor rows =
      x.index_select(0, OnDevice(at::tensor(head_rows, long_opts), dev));
  at::Tensor logits =
      AsFloat(head_.Logits(RmsNorm(rows, final_norm_, c.rms_norm_eps)));
  if (!seeds.rows.empty()) AddSeedBonus(seeds, &logits);
  // Confidence = max softmax probability = 1 / sum(exp(l - max)).
  if (GetCpuProducts() != CpuProducts::kBlas && CpuKernelsApply(logits) &&
      logits.dim() == 2) {
    // One pass for the argmax and one for the sum instead of six ops.
    at::Tensor argmax = at::empty({logits.size(0)}, long_opts);
    at::Tensor conf = at::empty({logits.size(0)}, logits.options());
    CpuArgmaxConfidence(logits.data_ptr<float>(), logits.size(0),
                        logits.size(1), argmax.data_ptr<int64_t>(),
                        conf.data_ptr<float>());
    return {argmax, conf};
  }
  auto [max_logit, argmax] = logits.max(-1);
  at::Tensor conf =
      at::exp(logits - max_logit.unsqueeze(1)).sum(-1).reciprocal();
  return {argmax, conf};
}

std::optional<int64_t> ContextQueue::End(SequenceId id) const {
  auto it = ends_.find(id);
  if (it == ends_.end()) return std::nullopt;
  return it->second;
}

void ContextQueue::Push(DEditDrafter::ContextChunk chunk) {
  const int64_t n = chunk.features.size(0);
  ends_[chunk.sequence] = chunk.start + n;
  rows_ += n;
  chunks_.push_back(std::move(chunk));
}

void ContextQueue::Drop(SequenceId id) {
  if (ends_.erase(id) == 0) return;
  auto dropped = [&](const DEditDrafter::ContextChunk& c) {
    if (c.sequence != id) return false;
    rows_ -= c.features.size(0);
    return true;
  };
  chunks_.erase(std::remove_if(chunks_.begin(), chunks_.end(), dropped),
                chunks_.end());
}

absl::Status ContextQueue::Flush(DEditDrafter& drafter,
                                 std::vector<SequenceId>* sequences) {
  if (chunks_.empty()) return absl::OkStatus();
  if (sequences != nullptr) {
    for (const auto& [id, end] : ends_) sequences->push_back(id);
  }
  std::vector<DEditDrafter::ContextChunk> chunks;
  chunks.swap(chunks_);
  ends_.clear();
  rows_ = 0;
  return drafter.AppendContexts(chunks);
}

}  // namespace dedit
