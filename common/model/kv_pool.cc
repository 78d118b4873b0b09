#include "common/model/kv_pool.h"

#include <ATen/Functions.h>
#include <c10/core/InferenceMode.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/model/cpu/cpu_attention.h"
#include "common/model/cpu/cpu_panels.h"

namespace dedit {
namespace {

std::atomic<KvCacheDtype> process_kv_dtype{KvCacheDtype::kAuto};

}  // namespace

void SetKvCacheDtype(KvCacheDtype dtype) { process_kv_dtype.store(dtype); }
KvCacheDtype GetKvCacheDtype() { return process_kv_dtype.load(); }

std::string_view KvCacheDtypeName(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::kAuto:
      return "auto";
    case KvCacheDtype::kModel:
      return "model";
    case KvCacheDtype::kBf16:
      return "bf16";
  }
  return "?";
}

absl::Status SetKvCacheDtypeFlag(std::string_view name) {
  for (KvCacheDtype dtype :
       {KvCacheDtype::kAuto, KvCacheDtype::kModel, KvCacheDtype::kBf16}) {
    if (name == KvCacheDtypeName(dtype)) {
      SetKvCacheDtype(dtype);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--kv_cache_dtype must be auto, model or bf16, got \"",
                   std::string(name), "\""));
}

absl::StatusOr<at::ScalarType> KvPoolDtype(at::ScalarType model_dtype,
                                           c10::Device device,
                                           int64_t head_dim) {
  // What the CPU's bf16 row kernel serves.
  const bool cpu_bf16 = device.is_cpu() && model_dtype == at::kFloat &&
                        GetCpuProducts() != CpuProducts::kBlas &&
                        CpuAttentionBf16Runs(head_dim);
  switch (GetKvCacheDtype()) {
    case KvCacheDtype::kModel:
      return model_dtype;
    case KvCacheDtype::kAuto:
      return cpu_bf16 && GetCpuProducts() == CpuProducts::kBf16 ? at::kBFloat16
                                                                : model_dtype;
    case KvCacheDtype::kBf16:
      break;
  }
  if (model_dtype == at::kBFloat16 || cpu_bf16) return at::kBFloat16;
  if (!device.is_cpu()) {
    return absl::FailedPreconditionError(
        "--kv_cache_dtype=bf16 on a GPU needs a bf16 model (the pool keeps "
        "the model's dtype there)");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "--kv_cache_dtype=bf16 on the CPU needs an fp32 model on the row "
      "attention kernel: --cpu_products f32 or bf16 (now ",
      std::string(CpuProductsName(GetCpuProducts())),
      "), a CPU with its bf16 kernel (AVX2 and FMA, or AVX512_BF16: ",
      CpuRuns(CpuProducts::kBf16) ? "present" : "absent",
      ") and a head_dim that is a multiple of 32 (", head_dim, ")"));
}

KvPool::KvPool(const Shape& shape, at::ScalarType dtype, c10::Device device,
               int initial_slots, int max_slots, int64_t initial_slab_tokens)
    : shape_(shape),
      dtype_(dtype),
      device_(device),
      initial_slots_(std::clamp(initial_slots, 1, std::max(max_slots, 1))),
      initial_slab_(SlabFor(std::clamp<int64_t>(
          initial_slab_tokens, 1, std::max<int64_t>(shape.max_tokens, 1)))),
      max_slots_(std::max(max_slots, 1)),
      k_(shape.num_layers),
      v_(shape.num_layers) {
  Resize(initial_slots_, initial_slab_);
}

void KvPool::Reserve(int64_t tokens) {
  if (tokens <= slab_) return;
  c10::InferenceMode inference_mode;
  Resize(capacity_,
         SlabFor(std::min(std::max(tokens, 2 * slab_), shape_.max_tokens)));
}

int64_t KvPool::SlabFor(int64_t tokens) const {
  if (!shape_.bf16_row_kernel) return tokens;
  return (tokens + kBf16KeyBlock - 1) / kBf16KeyBlock * kBf16KeyBlock;
}

at::Tensor KvPool::KeyBlocks(const at::Tensor& keys) const {
  return keys.view({keys.size(0), shape_.kv_heads, slab_ / kBf16KeyBlock,
                    shape_.head_dim / 2, kBf16KeyBlock, 2});
}

at::Tensor KvPool::KeyRows(int layer) const {
  if (!shape_.bf16_row_kernel) return k_[layer];
  return KeyBlocks(k_[layer])
      .permute({0, 1, 2, 4, 3, 5})
      .reshape({capacity_, shape_.kv_heads, slab_, shape_.head_dim});
}

// Every tensor op of the pool runs in InferenceMode: its tensors are
// inference tensors wherever they were made (a forward may grow them), and
// libtorch refuses in-place updates of those outside InferenceMode.
void KvPool::Resize(int slots, int64_t slab) {
  c10::InferenceMode inference_mode;
  auto opts = at::TensorOptions().dtype(dtype_).device(device_);
  const int used = static_cast<int>(slot_owner_.size());
  const int64_t keep = std::min(slab, slab_);
  for (int l = 0; l < shape_.num_layers; ++l) {
    // Zeroed, so that never-written positions are finite (see the header).
    at::Tensor k =
        at::zeros({slots, shape_.kv_heads, slab, shape_.head_dim}, opts);
    at::Tensor v = at::zeros_like(k);
    if (used > 0 && keep > 0) {
      k.narrow(0, 0, used)
          .narrow(2, 0, keep)
          .copy_(k_[l].narrow(0, 0, used).narrow(2, 0, keep));
      v.narrow(0, 0, used)
          .narrow(2, 0, keep)
          .copy_(v_[l].narrow(0, 0, used).narrow(2, 0, keep));
    }
    k_[l] = std::move(k);
    v_[l] = std::move(v);
  }
  slab_ = slab;
  const int64_t rows = int64_t{slots} * shape_.kv_heads * slab_;
  k_rows_.assign(k_.size(), at::Tensor());
  v_rows_.assign(v_.size(), at::Tensor());
  for (int l = 0; l < shape_.num_layers; ++l) {
    k_rows_[l] = k_[l].view({rows, shape_.head_dim});
    v_rows_[l] = v_[l].view({rows, shape_.head_dim});
  }
  // The new tensors are zeroed past what was copied: only the used slots
  // have written positions, all within the new slab (MaybeShrink keeps the
  // longest).
  high_water_.resize(slots, 0);
  for (int i = 0; i < slots; ++i) {
    high_water_[i] = i < used ? std::min(high_water_[i], slab_) : 0;
  }
  capacity_ = slots;
}

absl::Status KvPool::Add(SequenceId id) {
  c10::InferenceMode inference_mode;
  if (seqs_.count(id)) {
    return absl::AlreadyExistsError(absl::StrCat("sequence ", id, " exists"));
  }
  absl::StatusOr<int> slot = TakeSlot();
  if (!slot.ok()) return slot.status();
  seqs_[id] = Seq{*slot, 0};
  slot_owner_.push_back(id);
  return absl::OkStatus();
}

absl::StatusOr<int> KvPool::TakeSlot() {
  const int slot = static_cast<int>(slot_owner_.size());
  if (slot == capacity_) {
    if (capacity_ >= max_slots_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("KV pool full: ", max_slots_, " sequences of up to ",
                       shape_.max_tokens, " tokens"));
    }
    Resize(std::min(capacity_ * 2, max_slots_), slab_);
  }
  // A previous occupant's values are finite, but may be NaN if its model
  // produced NaN: clear what it wrote.
  ClearSlot(slot, 0, high_water_[slot]);
  high_water_[slot] = 0;
  return slot;
}

void KvPool::ClearSlot(int slot, int64_t from, int64_t to) {
  if (to <= from) return;
  for (int l = 0; l < shape_.num_layers; ++l) {
    v_[l][slot].narrow(1, from, to - from).zero_();
    if (!shape_.bf16_row_kernel) {
      k_[l][slot].narrow(1, from, to - from).zero_();
      continue;
    }
    // Blocked keys ([kv, blocks, pairs, 16, 2]): whole blocks at once, the
    // positions of a partial block alone (the rest may be another
    // sequence's).
    const at::Tensor blocks = KeyBlocks(k_[l])[slot];
    for (int64_t p = from; p < to;) {
      const int64_t b = p / kBf16KeyBlock, lo = p % kBf16KeyBlock;
      if (lo == 0 && to - p >= kBf16KeyBlock) {
        const int64_t n = (to - p) / kBf16KeyBlock;
        blocks.narrow(1, b, n).zero_();
        p += n * kBf16KeyBlock;
      } else {
        const int64_t hi =
            std::min<int64_t>(kBf16KeyBlock, to - b * kBf16KeyBlock);
        blocks.narrow(1, b, 1).narrow(3, lo, hi - lo).zero_();
        p = b * kBf16KeyBlock + hi;
      }
    }
  }
}

void KvPool::AppendRows(int slot, int64_t start, int64_t n,
                        std::vector<int64_t>* rows) const {
  for (int64_t i = 0; i < n; ++i) {
    for (int h = 0; h < shape_.kv_heads; ++h) {
      rows->push_back((int64_t{slot} * shape_.kv_heads + h) * slab_ + start +
                      i);
    }
  }
}

void KvPool::CopySlot(int from, int to, int64_t n) {
  if (n <= 0) return;
  // Blocked keys: whole blocks (a block of 16 positions is 16 of the
  // plane's hd-element rows; the copied tail is finite).
  const int64_t nk = SlabFor(n);
  for (int l = 0; l < shape_.num_layers; ++l) {
    k_[l][to].narrow(1, 0, nk).copy_(k_[l][from].narrow(1, 0, nk));
    v_[l][to].narrow(1, 0, n).copy_(v_[l][from].narrow(1, 0, n));
  }
}

absl::Status KvPool::Remove(SequenceId id) {
  c10::InferenceMode inference_mode;
  auto it = seqs_.find(id);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
  }
  const int slot = it->second.slot;
  seqs_.erase(it);
  if (slot < 0) {
    auto parked = parked_.find(id);
    for (const auto* list : {&parked->second.k, &parked->second.v}) {
      for (const at::Tensor& t : *list) parked_bytes_ -= t.nbytes();
    }
    parked_.erase(parked);
    return absl::OkStatus();
  }
  FreeSlot(slot);
  MaybeShrink();
  return absl::OkStatus();
}

void KvPool::FreeSlot(int freed) {
  const int last = static_cast<int>(slot_owner_.size()) - 1;
  if (freed != last) {
    // Keep slots dense: the last sequence moves into the hole, carrying
    // everything it wrote (its transient block included).
    const SequenceId moved = slot_owner_[last];
    const int64_t n = high_water_[last];
    CopySlot(last, freed, n);
    ClearSlot(freed, n, high_water_[freed]);  // the leaving sequence's tail
    high_water_[freed] = n;
    slot_owner_[freed] = moved;
    seqs_[moved].slot = freed;
  }
  slot_owner_.pop_back();
}

absl::Status KvPool::Park(SequenceId id) {
  c10::InferenceMode inference_mode;
  auto it = seqs_.find(id);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
  }
  Seq& seq = it->second;
  if (seq.slot < 0) return absl::OkStatus();
  const int64_t n = seq.length, nk = SlabFor(n);
  ParkedKv kv;
  for (int l = 0; l < shape_.num_layers; ++l) {
    kv.k.push_back(k_[l][seq.slot].narrow(1, 0, nk).clone());
    kv.v.push_back(v_[l][seq.slot].narrow(1, 0, n).clone());
    parked_bytes_ += kv.k.back().nbytes() + kv.v.back().nbytes();
  }
  parked_[id] = std::move(kv);
  const int slot = seq.slot;
  seq.slot = -1;
  FreeSlot(slot);
  MaybeShrink();
  return absl::OkStatus();
}

absl::Status KvPool::MakeResident(SequenceId id) {
  c10::InferenceMode inference_mode;
  auto it = seqs_.find(id);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", id));
  }
  if (it->second.slot >= 0) return absl::OkStatus();
  auto parked = parked_.find(id);
  // What was parked (a rollback since may have shortened the length).
  const int64_t n = parked->second.v[0].size(1);
  const int64_t nk = parked->second.k[0].size(1);
  Reserve(n);
  absl::StatusOr<int> slot = TakeSlot();
  if (!slot.ok()) return slot.status();
  for (int l = 0; l < shape_.num_layers; ++l) {
    k_[l][*slot].narrow(1, 0, nk).copy_(parked->second.k[l]);
    v_[l][*slot].narrow(1, 0, n).copy_(parked->second.v[l]);
    parked_bytes_ -=
        parked->second.k[l].nbytes() + parked->second.v[l].nbytes();
  }
  parked_.erase(parked);
  high_water_[*slot] = nk;
  it->second.slot = *slot;
  slot_owner_.push_back(id);
  return absl::OkStatus();
}

void KvPool::MaybeShrink() {
  const int used = static_cast<int>(slot_owner_.size());
  int slots = capacity_;
  while (slots > initial_slots_ && used <= slots / 4) slots /= 2;
  slots = std::max(slots, initial_slots_);
  int64_t longest = 0;  // what the resident slots hold, transient included
  for (int i = 0; i < used; ++i) longest = std::max(longest, high_water_[i]);
  // Twice the longest, so that it can grow before the next doubling.
  const int64_t slab = longest <= slab_ / 4
                           ? std::max(initial_slab_, SlabFor(2 * longest))
                           : slab_;
  if (slots == capacity_ && slab == slab_) return;
  Resize(slots, slab);
#if defined(__GLIBC__)
  // glibc keeps freed chunks in its arenas (and large ones may come from
  // there once its mmap threshold has risen): hand the pages back, so RSS
  // follows the pool.
  if (device_.is_cpu()) malloc_trim(0);
#endif
}

int64_t KvPool::TokenBytes() const {
  return int64_t{2} * shape_.num_layers * shape_.kv_heads * shape_.head_dim *
         static_cast<int64_t>(c10::elementSize(dtype_));
}

int64_t KvPool::used_bytes() const { return total_length() * TokenBytes(); }

void KvPool::SetLength(SequenceId id, int64_t length) {
  Seq& s = seqs_.at(id);
  s.length = length;
  // A parked sequence's copy keeps its tail; only the length counts.
  if (s.slot >= 0) {
    high_water_[s.slot] = std::max(high_water_[s.slot], length);
  }
}

void KvPool::MarkWritten(SequenceId id, int64_t end) {
  const int slot = seqs_.at(id).slot;
  high_water_[slot] = std::max(high_water_[slot], end);
}

int64_t KvPool::total_length() const {
  int64_t n = 0;
  for (const auto& [id, s] : seqs_) n += s.length;
  return n;
}

void KvPool::WriteRows(int layer, const std::vector<int64_t>& flat_rows,
                       const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(
      k.device().is_cpu() && k.scalar_type() == at::kFloat &&
          v.scalar_type() == at::kFloat && k.stride(2) == 1 &&
          v.stride(2) == 1 &&
          static_cast<int64_t>(flat_rows.size()) == k.size(0) * shape_.kv_heads,
      "KvPool::WriteRows: fp32 CPU rows of contiguous heads");
  WriteRows(layer, flat_rows, k.data_ptr<float>(), k.stride(0), k.stride(1),
            v.data_ptr<float>(), v.stride(0), v.stride(1));
}

void KvPool::WriteRows(int layer, const std::vector<int64_t>& flat_rows,
                       const float* k, int64_t k_token_stride,
                       int64_t k_head_stride, const float* v,
                       int64_t v_token_stride, int64_t v_head_stride) {
  const int64_t kv = shape_.kv_heads, hd = shape_.head_dim;
  const bool bf16 = dtype_ == at::kBFloat16;
  TORCH_CHECK((dtype_ == at::kFloat || bf16) && k_[layer].device().is_cpu() &&
                  static_cast<int64_t>(flat_rows.size()) % kv == 0,
              "KvPool::WriteRows: an fp32 or bf16 CPU pool and whole tokens");
  const int64_t tokens = static_cast<int64_t>(flat_rows.size()) / kv;
  if (bf16) {
    // Rounded as the row kernel rounds its queries (CpuFloatsToBf16).
    auto* keys = static_cast<uint16_t*>(k_rows_[layer].data_ptr());
    auto* values = static_cast<uint16_t*>(v_rows_[layer].data_ptr());
    std::vector<uint16_t> key(hd);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < kv; ++h) {
        const int64_t row = flat_rows[t * kv + h];
        CpuFloatsToBf16(v + t * v_token_stride + h * v_head_stride, hd,
                        values + row * hd);
        if (!shape_.bf16_row_kernel) {
          CpuFloatsToBf16(k + t * k_token_stride + h * k_head_stride, hd,
                          keys + row * hd);
          continue;
        }
        // Blocked: each element pair to its place in the position's block.
        CpuFloatsToBf16(k + t * k_token_stride + h * k_head_stride, hd,
                        key.data());
        const int64_t pos = row % slab_;
        uint16_t* plane = keys + (row - pos) * hd;
        for (int64_t d = 0; d < hd; d += 2) {
          std::memcpy(plane + Bf16KeyOffset(pos, d, hd), key.data() + d,
                      2 * sizeof(uint16_t));
        }
      }
    }
    return;
  }
  float* keys = k_rows_[layer].data_ptr<float>();
  float* values = v_rows_[layer].data_ptr<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < kv; ++h) {
      const int64_t row = flat_rows[t * kv + h];
      std::memcpy(keys + row * hd, k + t * k_token_stride + h * k_head_stride,
                  hd * sizeof(float));
      std::memcpy(values + row * hd, v + t * v_token_stride + h * v_head_stride,
                  hd * sizeof(float));
    }
  }
}

void KvPool::Write(int layer, const at::Tensor& flat_index, const at::Tensor& k,
                   const at::Tensor& v) {
  TORCH_CHECK(!shape_.bf16_row_kernel,
              "KvPool::Write: the bf16 row kernel's blocked keys are written "
              "by WriteRows");
  c10::InferenceMode inference_mode;
  const int64_t n = k.size(0) * shape_.kv_heads;
  k_rows_[layer].index_copy_(0, flat_index,
                             k.reshape({n, shape_.head_dim}).to(dtype_));
  v_rows_[layer].index_copy_(0, flat_index,
                             v.reshape({n, shape_.head_dim}).to(dtype_));
}

int64_t KvPool::nbytes() const {
  int64_t total = parked_bytes_;
  for (int l = 0; l < shape_.num_layers; ++l) {
    total += k_[l].nbytes() + v_[l].nbytes();
  }
  return total;
}

}  // namespace dedit
