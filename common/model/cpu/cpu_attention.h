// Attention on the CPU one query row at a time, with AVX-512 or AVX2+FMA
// (the --cpu_products f32|bf16 path; common/model/cpu/cpu_panels.h: the ISA
// is CpuIsaOf the kind of the K/V, f32 or bf16).
//
// PackedAttention's matmul path pads a batch's queries and keys and runs
// bmm / softmax / bmm over them, so a row's sums depend on the shapes
// around it: OpenBLAS picks its kernel by shape, and the softmax reduces
// over the padded key count. A verify row then differs from the decode
// step of the same token in its last bits. With bf16 products that is not
// harmless: a last-bit difference can move an activation's bf16 rounding
// by 2^-8 and flip a near tie, so speculation would not reproduce greedy
// decoding. Here each (row, head) is computed from its query and its
// visible keys alone, in one fixed order: scores in blocks of 16 keys from
// key 0, the softmax with a vectorised exp, then the weighted values key
// by key. A row's output is the same to the bit whatever the rows, heads
// and threads beside it. Query heads that share a kv head (grouped-query
// attention) run in one pass over its keys and values where their
// registers fit (head sizes to 112, even group): each key and value is
// loaded once for two heads, and each head's sums stay the ones it gets
// alone, in the same order (docs/log/2026-12-06-bench-notebook.md,
// "Grouped-query heads in one pass"). The AVX2 kernels keep that contract
// in orders of their own (8-key score blocks; a 16-key bf16 block as two
// halves), and pair two heads only at head size 16.
#ifndef DEDIT_MODEL_CPU_ATTENTION_H_
#define DEDIT_MODEL_CPU_ATTENTION_H_

#include <cstdint>

namespace dedit {

class CpuProductPool;

// Whether CpuAttention runs on this CPU for head_dim `head_dim`
// (CpuRuns(kF32): AVX-512 or AVX2+FMA; a multiple of 16, at most 128).
bool CpuAttentionRuns(int64_t head_dim);

// Whether CpuAttentionBf16 runs: CpuAttentionRuns, CpuRuns(kBf16)
// (AVX512_BF16 or AVX2+FMA), and head_dim a multiple of 32.
bool CpuAttentionBf16Runs(int64_t head_dim);

struct CpuAttentionRows {
  int64_t n = 0;                     // query rows
  const int32_t* slot = nullptr;     // [n] KV pool slot of each row
  const int64_t* visible = nullptr;  // [n] keys [0, visible) it attends
};

// out[r, h * hd .. (h + 1) * hd) = softmax(q[r, h] . K^T) V over the
// row's slot's keys [0, visible), for query head h on kv head h / (heads /
// kv_heads). q: rows of stride q_row_stride, heads at stride hd (pre-scaled
// by 1/sqrt(hd)); keys, values: one fp32 layer of the pool, [slots, kv_heads,
// slab, hd]; out: [n, heads * hd]. Every visible count >= 1. With a pool,
// the (row, head) pairs are dealt to its threads.
void CpuAttention(const float* q, int64_t q_row_stride,
                  const CpuAttentionRows& rows, int heads, int kv_heads,
                  int64_t hd, const float* keys, const float* values,
                  int64_t slab, float* out, CpuProductPool* pool);

// Where key position p's element d sits in a slab of the bf16 kernel's
// keys: in blocks of 16 positions, each [hd / 2][16][2] (a pair of
// elements of 16 keys per 32 bf16), so that one VDPBF16PS adds an element
// pair to 16 keys' scores. A slab's length is a multiple of 16.
constexpr int64_t kBf16KeyBlock = 16;
inline int64_t Bf16KeyOffset(int64_t p, int64_t d, int64_t hd) {
  return ((p / kBf16KeyBlock) * (hd / 2) + d / 2) * (2 * kBf16KeyBlock) +
         (p % kBf16KeyBlock) * 2 + d % 2;
}

// CpuAttention over a bf16 pool (--kv_cache_dtype bf16,
// common/model/kv_pool.h): keys and values are bf16 bits, keys in the blocked
// layout above (slab a multiple of 16), values as rows. Each query is rounded
// to bf16 (to nearest even) and a block's 16 scores are VDPBF16PS sums in f32
// (on AVX2: each bf16 widened to f32 and the pair's two products added by
// FMA, odd then even, as VDPBF16PS defines it), then the same softmax; the
// values are widened to f32 (exactly) and summed with the f32 weights. A row's
// output is still the same to the bit whatever the batch. REQUIRES
// CpuAttentionBf16Runs(hd).
void CpuAttentionBf16(const float* q, int64_t q_row_stride,
                      const CpuAttentionRows& rows, int heads, int kv_heads,
                      int64_t hd, const uint16_t* keys, const uint16_t* values,
                      int64_t slab, float* out, CpuProductPool* pool);

}  // namespace dedit

#endif  // DEDIT_MODEL_CPU_ATTENTION_H_
