// Key/value storage for every sequence of one model: a pool of fixed-size
// slabs, one per resident sequence, plus compact copies of parked ones.
//
// Each layer holds K and V as one tensor [slots, kv_heads, slab, head_dim].
// A resident sequence owns a slot, appends in place, and Truncate() only
// moves the length: rollback after a rejected draft costs nothing. The slab
// is as long as the longest resident sequence needs, rounded up by doubling
// (Reserve: the whole pool is copied then, amortised O(1) per token), up to
// `max_tokens`, the most a sequence can ever hold (the model's context
// limit): short sequences of a long-context model cost short slabs.
// Occupied slots are kept dense ([0, size())): removing a sequence moves
// the last slot's tokens into the freed one. A forward over any set of
// sequences therefore attends over one strided view of the pool
// (common/model/packed_attention.h), with no gather and no per-sequence
// attention call.
//
// The pool starts with `initial_slots` slots and doubles, copying, when a
// sequence is added to a full pool (admission time only), up to
// `max_slots`; beyond that Add() is RESOURCE_EXHAUSTED.
//
// Memory follows the sequences, not the longest one ever seen:
//   * a parked sequence (Park: a session kept between turns) leaves its
//     slot for a copy of exactly its tokens; it returns to a slot
//     (MakeResident) before its next forward, so an idle sequence costs its
//     own tokens' KV, not a slab;
//   * when removing or parking leaves the slots at most a quarter used, or
//     the longest resident sequence within a quarter of the slab, the pool
//     halves (copying, like a growth) down to its initial size, and the
//     freed memory is returned to the OS (malloc_trim), so the process's
//     RSS falls back after a burst. The quarter rule keeps a grow/shrink
//     cycle amortised: a halving needs as many removals as the growth
//     before it took additions.
// A batch of resident sequences still pays the slab of its longest one
// each: that is the price of the dense layout's gather-free attention.
// docs/ARCHITECTURE.md §7 gives the sizes.
//
// Slab positions past a sequence's length hold stale but finite values: a
// new occupant's slab is zeroed up to the previous occupant's high-water
// mark, because padded attention multiplies them by zero weights and a
// stale NaN would poison the product.
//
// The pool holds K/V in the model's dtype or in bf16 (--kv_cache_dtype,
// KvPoolDtype below; bf16 by default under --cpu_products bf16): half the
// bytes, read on the CPU by the bf16 row kernel
// (common/model/cpu/cpu_attention.h).
//
// Not thread-safe: the pool belongs to the model thread that owns the model.
#ifndef DEDIT_MODEL_KV_POOL_H_
#define DEDIT_MODEL_KV_POOL_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/draft.h"

namespace dedit {

// The K/V cache's element type, process-wide (--kv_cache_dtype, set before
// a model loads):
enum class KvCacheDtype {
  kAuto,   // bf16 for an fp32 CPU model under --cpu_products bf16 whose
           // head_dim the bf16 row kernel takes (CpuAttentionBf16Runs):
           // its activations are already rounded to bf16 before every
           // product, as on a GPU serving the bf16 checkpoint, which caches
           // bf16 K/V. Otherwise the model's dtype.
  kModel,  // the model's dtype
  kBf16,   // bf16: on the CPU, fp32 models on the row kernel; on a GPU,
           // bf16 models
};
void SetKvCacheDtype(KvCacheDtype dtype);
KvCacheDtype GetKvCacheDtype();
// --kv_cache_dtype: "auto", "model" or "bf16"; INVALID_ARGUMENT naming the
// flag otherwise.
absl::Status SetKvCacheDtypeFlag(std::string_view name);
std::string_view KvCacheDtypeName(KvCacheDtype dtype);
// The dtype of a pool for a model of `model_dtype` on `device` with heads
// of `head_dim`, under GetKvCacheDtype(): FAILED_PRECONDITION, naming the
// flag and what is missing, for a bf16 cache asked for that this model
// cannot attend over (on the CPU: --cpu_products blas, a CPU without AVX2
// and FMA, or a head_dim not a multiple of 32; on a GPU: an fp32 model).
absl::StatusOr<at::ScalarType> KvPoolDtype(at::ScalarType model_dtype,
                                           c10::Device device,
                                           int64_t head_dim);
// Whether a pool of `kv_dtype` for a model of `model_dtype` on `device`
// is read by the CPU's bf16 row kernel (Shape::bf16_row_kernel): bf16 K/V
// of an fp32 CPU model, which KvPoolDtype gives only where that kernel
// runs.
inline bool Bf16RowKernelPool(at::ScalarType kv_dtype,
                              at::ScalarType model_dtype, c10::Device device) {
  return kv_dtype == at::kBFloat16 && model_dtype == at::kFloat &&
         device.is_cpu();
}

class KvPool {
 public:
  struct Shape {
    int num_layers = 0;
    int kv_heads = 0;
    int head_dim = 0;
    int64_t max_tokens = 0;  // tokens one sequence can ever hold
    // bf16 K/V of an fp32 CPU model, read by the CPU's bf16 row kernel
    // (PackedAttention takes it; a bf16 model's bf16 pool is not).
    bool bf16_row_kernel = false;
  };
  KvPool(const Shape& shape, at::ScalarType dtype, c10::Device device,
         int initial_slots = 4, int max_slots = 1 << 16,
         int64_t initial_slab_tokens = 256);

  const Shape& shape() const { return shape_; }
  at::ScalarType dtype() const { return dtype_; }
  // The current slab length: positions [0, slab) exist in every slot.
  int64_t slab_tokens() const { return slab_; }
  // Makes every slab hold at least `tokens` positions (doubling, copying).
  // REQUIRES tokens <= shape().max_tokens. Invalidates AppendRows rows
  // and views taken before.
  void Reserve(int64_t tokens);

  // ALREADY_EXISTS for a known id; RESOURCE_EXHAUSTED past max_slots.
  absl::Status Add(SequenceId id);
  // NOT_FOUND for an unknown id. May shrink the pool.
  absl::Status Remove(SequenceId id);
  bool Contains(SequenceId id) const { return seqs_.count(id) > 0; }
  // Resident sequences (those in slots).
  size_t size() const { return slot_owner_.size(); }
  // Every sequence, resident or parked.
  size_t sequences() const { return seqs_.size(); }
  int capacity_slots() const { return capacity_; }

  // Moves a resident sequence's tokens out of its slot into a copy of
  // exactly its length, and frees the slot (may shrink the pool). Nothing
  // for a parked one; NOT_FOUND for an unknown id.
  absl::Status Park(SequenceId id);
  // Brings a parked sequence back into a slot (may grow the pool, and
  // invalidates rows and views like Reserve); nothing for a resident one.
  // NOT_FOUND for an unknown id, RESOURCE_EXHAUSTED past max_slots (it
  // stays parked).
  absl::Status MakeResident(SequenceId id);
  bool Parked(SequenceId id) const { return seqs_.at(id).slot < 0; }

  // REQUIRES Contains(id); Slot also !Parked(id).
  int Slot(SequenceId id) const { return seqs_.at(id).slot; }
  int64_t Length(SequenceId id) const { return seqs_.at(id).length; }
  // Sets the number of valid tokens (after a forward's writes, or to roll
  // back; a parked sequence only rolls back). REQUIRES 0 <= length <=
  // slab_tokens().
  void SetLength(SequenceId id, int64_t length);
  // Records that positions below `end` of `id`'s slab were written (a
  // transient block past the length counts).
  void MarkWritten(SequenceId id, int64_t end);
  int64_t total_length() const;

  // [slots, kv_heads, slab_tokens, head_dim] of `layer`. A
  // bf16_row_kernel pool holds its keys in the bf16 kernel's blocks
  // (Bf16KeyOffset, common/model/cpu/cpu_attention.h; slab_tokens a multiple of
  // 16): the same size, its rows not positions.
  const at::Tensor& keys(int layer) const { return k_[layer]; }
  // The keys as rows of positions, [slots, kv_heads, slab_tokens,
  // head_dim]: keys(layer) itself, or a copy of a blocked pool's.
  at::Tensor KeyRows(int layer) const;
  const at::Tensor& values(int layer) const { return v_[layer]; }
  // Writes k, v ([n, kv_heads, head_dim]) of `layer` at the flat rows
  // `flat_index` ([n * kv_heads], from AppendRows) in one op each
  // (converted to the pool's dtype). Not for a bf16_row_kernel pool.
  void Write(int layer, const at::Tensor& flat_index, const at::Tensor& k,
             const at::Tensor& v);
  // The same from a host list of the flat rows, copying row by row with
  // no ATen op (a bf16 pool rounds them, CpuFloatsToBf16): for fp32 or
  // bf16 CPU pools and fp32 k, v whose last dimension is contiguous (the
  // CPU row path, common/model/cpu/cpu_attention.h). REQUIRES flat_rows.size()
  // == k.size(0) * kv_heads.
  void WriteRows(int layer, const std::vector<int64_t>& flat_rows,
                 const at::Tensor& k, const at::Tensor& v);
  // The same from raw fp32 rows: token t's kv head h at k + t *
  // k_token_stride + h * k_head_stride (head_dim adjacent floats), and v
  // alike; flat_rows.size() / kv_heads tokens.
  void WriteRows(int layer, const std::vector<int64_t>& flat_rows,
                 const float* k, int64_t k_token_stride, int64_t k_head_stride,
                 const float* v, int64_t v_token_stride, int64_t v_head_stride);
  // Appends to `rows` the flat rows (Write's index) of positions
  // [start, start + n) of `slot`: token-major, kv heads inner, as k and v
  // come out of a projection. Valid until the next Reserve or Add.
  void AppendRows(int slot, int64_t start, int64_t n,
                  std::vector<int64_t>* rows) const;
  // Bytes held on the device: the slots and the parked copies.
  int64_t nbytes() const;
  // Bytes the sequences' tokens take (their lengths, resident or parked):
  // what nbytes() would be with no slack.
  int64_t used_bytes() const;

 private:
  struct Seq {
    int slot = 0;  // -1 while parked
    int64_t length = 0;
  };
  // A parked sequence's tokens: per layer, keys [kv_heads, SlabFor(n),
  // head_dim] (whole key blocks for the blocked layout) and values
  // [kv_heads, n, head_dim].
  struct ParkedKv {
    std::vector<at::Tensor> k, v;
  };
  // `tokens` rounded up to whole key blocks for a bf16_row_kernel pool.
  int64_t SlabFor(int64_t tokens) const;
  // keys ([slots, kv, slab, hd], blocked) as [slots, kv, blocks, hd / 2,
  // 16, 2].
  at::Tensor KeyBlocks(const at::Tensor& keys) const;
  // Reallocates for `slots` slots of `slab` positions, keeping the data.
  void Resize(int slots, int64_t slab);
  // Copies positions [0, n) of slot `from` into slot `to`, every layer.
  void CopySlot(int from, int to, int64_t n);
  // Takes the next free slot (growing the pool when full), cleared.
  absl::StatusOr<int> TakeSlot();
  // Gives `slot` back, moving the last slot's sequence into it.
  void FreeSlot(int slot);
  // Halves the slots while at most a quarter are used, and cuts the slab to
  // twice the longest resident sequence once that is within a quarter.
  void MaybeShrink();
  // K and V bytes of one token, every layer.
  int64_t TokenBytes() const;
  // Zeroes positions [from, to) of `slot`, every layer.
  void ClearSlot(int slot, int64_t from, int64_t to);

  Shape shape_;
  at::ScalarType dtype_;
  c10::Device device_;
  int capacity_ = 0;
  int64_t slab_ = 0;
  const int initial_slots_;
  const int64_t initial_slab_;
  int max_slots_;
  std::vector<at::Tensor> k_, v_;
  // k_, v_ viewed as [slots * kv_heads * slab_tokens, head_dim] (Write).
  std::vector<at::Tensor> k_rows_, v_rows_;
  std::unordered_map<SequenceId, Seq> seqs_;
  std::vector<SequenceId> slot_owner_;  // dense: slot i → its sequence
  std::vector<int64_t> high_water_;     // per slot: positions ever written
  std::unordered_map<SequenceId, ParkedKv> parked_;
  int64_t parked_bytes_ = 0;
};

}  // namespace dedit

#endif  // DEDIT_MODEL_KV_POOL_H_
