#include "common/model/cpu/cpu_attention.h"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/model/cpu/cpu_panels.h"
#include "common/model/cpu/cpu_product_pool.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define DEDIT_ATTENTION_X86 1
#include "common/model/cpu/cpu_avx2_math.h"
#include "common/model/cpu/cpu_avx512_math.h"
#else
#define DEDIT_ATTENTION_X86 0
#endif

namespace dedit {
namespace {

#if DEDIT_ATTENTION_X86

constexpr int64_t kLanes = 16;

using avx512::Exp;

// The transpose-reduce tree that sums each of 16 vectors' lanes, fed two
// vectors at a time: lane i of the result is the sum of t[i]'s 16 lanes.
// Add(t[2p], t[2p + 1]) for p = 0..7 in order; `sum` holds the result
// after the eighth.
// Each level's adds happen as soon as their operands exist, so at most one
// pending value per level is live (a few registers, whatever is being
// reduced beside it), and the adds are the same, on the same operands, for
// every block.
struct LaneSums {
  // Each set by Add before it is read; `sum` by the eighth.
  __m512 s, u, w, sum;

  DEDIT_AVX512 void Add(int p, __m512 a, __m512 b) {
    const __m512 sp =
        _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    if ((p & 1) == 0) {
      s = sp;
      return;
    }
    const __m512 up =
        _mm512_add_ps(_mm512_shuffle_ps(s, sp, _MM_SHUFFLE(1, 0, 1, 0)),
                      _mm512_shuffle_ps(s, sp, _MM_SHUFFLE(3, 2, 3, 2)));
    if ((p & 2) == 0) {
      u = up;
      return;
    }
    const __m512 wp =
        _mm512_add_ps(_mm512_shuffle_f32x4(u, up, _MM_SHUFFLE(2, 0, 2, 0)),
                      _mm512_shuffle_f32x4(u, up, _MM_SHUFFLE(3, 1, 3, 1)));
    if ((p & 4) == 0) {
      w = wp;
      return;
    }
    sum = _mm512_add_ps(_mm512_shuffle_f32x4(w, wp, _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm512_shuffle_f32x4(w, wp, _MM_SHUFFLE(3, 1, 3, 1)));
  }
};

// Each head's scores (Group rows of `stride` floats, the first `visible`
// real) become exp(score - max) in place, with scale[g] = 1 / their sum:
// the softmax of AttendGroup and AttendGroupBf16. best[g]: the lanes'
// running maxima of head g's scores.
template <int Group>
DEDIT_AVX512 inline void Softmax(float* scores, int64_t stride, int64_t visible,
                                 const __m512* best, __m512* scale) {
  for (int g = 0; g < Group; ++g) {
    float* sc = scores + g * stride;
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(best[g]));
    __m512 total = _mm512_setzero_ps();
    for (int64_t j0 = 0; j0 < visible; j0 += kLanes) {
      const int64_t in_block = std::min(kLanes, visible - j0);
      const __mmask16 live = avx512::LaneMask(in_block);
      const __m512 p = _mm512_maskz_mov_ps(
          live, Exp(_mm512_sub_ps(_mm512_loadu_ps(sc + j0), m)));
      _mm512_storeu_ps(sc + j0, p);
      total = _mm512_add_ps(total, p);
    }
    scale[g] = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total));
  }
}

// 16 values of a row: f32 as they are, bf16 widened to f32 (exact: the
// bits moved to the high half).
DEDIT_AVX512 inline __m512 LoadValues(const float* v) {
  return _mm512_loadu_ps(v);
}
DEDIT_AVX512 inline __m512 LoadValues(const uint16_t* v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v))),
      16));
}

// out[g] = scale[g] * sum_j p[g][j] values[j] over rows [0, visible) of
// values ([visible, hd], f32 or bf16), p[g] the Group rows of `stride`
// weights in scores: even and odd keys in two FMA chains per head, added
// at the end. Chunks = hd / 16.
template <int Chunks, int Group, typename V>
DEDIT_AVX512 inline void WeightedValues(const V* values, int64_t visible,
                                        const float* scores, int64_t stride,
                                        const __m512* scale, float* out) {
  constexpr int64_t hd = Chunks * kLanes;
  __m512 even[Group][Chunks], odd[Group][Chunks];
  for (int g = 0; g < Group; ++g) {
    for (int c = 0; c < Chunks; ++c) {
      even[g][c] = _mm512_setzero_ps();
      odd[g][c] = _mm512_setzero_ps();
    }
  }
  int64_t j = 0;
  for (; j + 1 < visible; j += 2) {
    const V* v = values + j * hd;
    __m512 v0[Chunks], v1[Chunks];
    for (int c = 0; c < Chunks; ++c) {
      v0[c] = LoadValues(v + c * kLanes);
      v1[c] = LoadValues(v + hd + c * kLanes);
    }
    for (int g = 0; g < Group; ++g) {
      const __m512 p0 = _mm512_set1_ps(scores[g * stride + j]);
      const __m512 p1 = _mm512_set1_ps(scores[g * stride + j + 1]);
      for (int c = 0; c < Chunks; ++c) {
        even[g][c] = _mm512_fmadd_ps(p0, v0[c], even[g][c]);
        odd[g][c] = _mm512_fmadd_ps(p1, v1[c], odd[g][c]);
      }
    }
  }
  if (j < visible) {
    for (int g = 0; g < Group; ++g) {
      const __m512 p0 = _mm512_set1_ps(scores[g * stride + j]);
      for (int c = 0; c < Chunks; ++c) {
        even[g][c] = _mm512_fmadd_ps(
            p0, LoadValues(values + j * hd + c * kLanes), even[g][c]);
      }
    }
  }
  for (int g = 0; g < Group; ++g) {
    for (int c = 0; c < Chunks; ++c) {
      _mm512_storeu_ps(
          out + g * hd + c * kLanes,
          _mm512_mul_ps(_mm512_add_ps(even[g][c], odd[g][c]), scale[g]));
    }
  }
}

// q . k in 16 lanes, chunk by chunk (their sum is the score).
template <int Chunks>
DEDIT_AVX512 inline __m512 Dot(const __m512* qv, const float* k) {
  __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
  for (int c = 1; c < Chunks; ++c) {
    acc = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + c * kLanes), acc);
  }
  return acc;
}

// The query heads h .. h + Group - 1 of one row, which share one kv head
// (grouped-query attention): q [Group, hd] (pre-scaled), keys / values
// [visible, hd] rows of one slab, out [Group, hd]. scores: room for Group
// times (visible rounded up to 16). Each key and value is loaded once for
// the group; each head's sums are the ones a group of one computes, in the
// same order, so a head's output does not depend on the group it ran in.
// Chunks = hd / 16, a template argument so that the queries and the
// accumulators stay in registers.
template <int Chunks, int Group>
DEDIT_AVX512 void AttendGroup(const float* q, const float* keys,
                              const float* values, int64_t visible,
                              float* scores, float* out) {
  constexpr int64_t hd = Chunks * kLanes;
  const int64_t stride = (visible + kLanes - 1) / kLanes * kLanes;
  __m512 qv[Group][Chunks];
  for (int g = 0; g < Group; ++g) {
    for (int c = 0; c < Chunks; ++c) {
      qv[g][c] = _mm512_loadu_ps(q + g * hd + c * kLanes);
    }
  }
  // Scores, 16 keys per block from key 0; keys past `visible` are not read.
  __m512 best[Group];
  for (int g = 0; g < Group; ++g) {
    best[g] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  }
  for (int64_t j0 = 0; j0 < visible; j0 += kLanes) {
    const int64_t in_block = std::min(kLanes, visible - j0);
    LaneSums sums[Group];
    for (int p = 0; p < kLanes / 2; ++p) {
      const int64_t i = 2 * p;
      const float* k = keys + (j0 + i) * hd;
      for (int g = 0; g < Group; ++g) {
        const __m512 a =
            i < in_block ? Dot<Chunks>(qv[g], k) : _mm512_setzero_ps();
        const __m512 b =
            i + 1 < in_block ? Dot<Chunks>(qv[g], k + hd) : _mm512_setzero_ps();
        sums[g].Add(p, a, b);
      }
    }
    const __mmask16 live = avx512::LaneMask(in_block);
    for (int g = 0; g < Group; ++g) {
      _mm512_storeu_ps(scores + g * stride + j0, sums[g].sum);
      best[g] = _mm512_mask_max_ps(best[g], live, best[g], sums[g].sum);
    }
  }
  __m512 scale[Group];
  Softmax<Group>(scores, stride, visible, best, scale);
  WeightedValues<Chunks, Group>(values, visible, scores, stride, scale, out);
}

// AttendGroup over bf16 K/V: keys in the blocked layout of
// Bf16KeyOffset (a block of 16 keys is [hd / 2 pairs][16 keys][2]),
// values as bf16 rows [visible, hd]. The queries are rounded to bf16 (to
// nearest even); a block's 16 scores come out in the lanes of two
// VDPBF16PS chains per head (pairs 0, 2, 4, ... and 1, 3, 5, ...: each
// adds one element pair of every key, the query's pair broadcast), added
// at the end, so no transpose-reduce tree is needed; then the softmax of
// AttendGroup, and the values widened to f32 (exact) and summed with the
// f32 weights as AttendGroup sums them. Lanes past `visible` in the last
// block read positions of the slab that hold finite values and are
// masked. Chunks = hd / 16, even.
template <int Chunks, int Group>
DEDIT_AVX512_BF16 void AttendGroupBf16(const float* q, const uint16_t* keys,
                                       const uint16_t* values, int64_t visible,
                                       float* scores, float* out) {
  static_assert(Chunks % 2 == 0, "bf16 key pairs come 16 to a vector");
  constexpr int Pairs = Chunks * kLanes / 2;
  constexpr int64_t hd = Chunks * kLanes;
  const int64_t stride = (visible + kLanes - 1) / kLanes * kLanes;
  // Each head's query as bf16 pairs, one uint32 per pair.
  alignas(64) uint32_t qp[Group][Pairs];
  for (int g = 0; g < Group; ++g) {
    for (int c = 0; c < Pairs; c += kLanes) {
      const float* piece = q + g * hd + 2 * c;
      _mm512_store_si512(qp[g] + c, (__m512i)_mm512_cvtne2ps_pbh(
                                        _mm512_loadu_ps(piece + kLanes),
                                        _mm512_loadu_ps(piece)));
    }
  }
  __m512 best[Group];
  for (int g = 0; g < Group; ++g) {
    best[g] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  }
  for (int64_t j0 = 0; j0 < visible; j0 += kLanes) {
    const uint16_t* block = keys + j0 * hd;
    __m512 even[Group], odd[Group];
    for (int g = 0; g < Group; ++g) {
      even[g] = _mm512_setzero_ps();
      odd[g] = _mm512_setzero_ps();
    }
    for (int i = 0; i < Pairs; i += 2) {
      const __m512bh k0 = (__m512bh)_mm512_loadu_si512(block + i * 2 * kLanes);
      const __m512bh k1 =
          (__m512bh)_mm512_loadu_si512(block + (i + 1) * 2 * kLanes);
      for (int g = 0; g < Group; ++g) {
        even[g] = _mm512_dpbf16_ps(
            even[g], k0,
            (__m512bh)_mm512_set1_epi32(static_cast<int>(qp[g][i])));
        odd[g] = _mm512_dpbf16_ps(
            odd[g], k1,
            (__m512bh)_mm512_set1_epi32(static_cast<int>(qp[g][i + 1])));
      }
    }
    const __mmask16 live = avx512::LaneMask(visible - j0);
    for (int g = 0; g < Group; ++g) {
      const __m512 sum = _mm512_add_ps(even[g], odd[g]);
      _mm512_storeu_ps(scores + g * stride + j0, sum);
      best[g] = _mm512_mask_max_ps(best[g], live, best[g], sum);
    }
  }
  __m512 scale[Group];
  Softmax<Group>(scores, stride, visible, best, scale);
  WeightedValues<Chunks, Group>(values, visible, scores, stride, scale, out);
}

// The AVX2 family: AttendGroup and AttendGroupBf16 on 8-lane ymm. Each
// (row, head) is still computed from its query and visible keys alone in
// one fixed order (its own, not AVX-512's: 8-key score blocks of f32
// K/V, two ymm per 16-key block of bf16 K/V), so a row's output is the
// same to the bit whatever the batch, on a CPU that runs this family.

// LaneSums on 8 lanes: Add(t[2p], t[2p + 1]) for p = 0..3 in order; lane i
// of `sum` is the sum of t[i]'s 8 lanes after the fourth.
struct LaneSumsAvx2 {
  __m256 s, u, sum;

  DEDIT_AVX2 void Add(int p, __m256 a, __m256 b) {
    const __m256 sp =
        _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    if ((p & 1) == 0) {
      s = sp;
      return;
    }
    const __m256 up =
        _mm256_add_ps(_mm256_shuffle_ps(s, sp, _MM_SHUFFLE(1, 0, 1, 0)),
                      _mm256_shuffle_ps(s, sp, _MM_SHUFFLE(3, 2, 3, 2)));
    if ((p & 2) == 0) {
      u = up;
      return;
    }
    sum = _mm256_add_ps(_mm256_permute2f128_ps(u, up, 0x20),
                        _mm256_permute2f128_ps(u, up, 0x31));
  }
};

// best = max(best, v) in the lanes of `live` (LaneMask).
DEDIT_AVX2 inline __m256 MaxIn(__m256 best, __m256 v, __m256i live) {
  return _mm256_blendv_ps(best, _mm256_max_ps(best, v),
                          _mm256_castsi256_ps(live));
}

// Softmax on AVX2.
template <int Group>
DEDIT_AVX2 inline void SoftmaxAvx2(float* scores, int64_t stride,
                                   int64_t visible, const __m256* best,
                                   __m256* scale) {
  for (int g = 0; g < Group; ++g) {
    float* sc = scores + g * stride;
    const __m256 m = _mm256_set1_ps(avx2::ReduceMax(best[g]));
    __m256 total = _mm256_setzero_ps();
    for (int64_t j0 = 0; j0 < visible; j0 += avx2::kLanes) {
      const __m256 p =
          _mm256_and_ps(avx2::Exp(_mm256_sub_ps(_mm256_loadu_ps(sc + j0), m)),
                        _mm256_castsi256_ps(avx2::LaneMask(visible - j0)));
      _mm256_storeu_ps(sc + j0, p);
      total = _mm256_add_ps(total, p);
    }
    scale[g] = _mm256_set1_ps(1.0f / avx2::ReduceAdd(total));
  }
}

DEDIT_AVX2 inline __m256 LoadValuesAvx2(const float* v) {
  return _mm256_loadu_ps(v);
}
DEDIT_AVX2 inline __m256 LoadValuesAvx2(const uint16_t* v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(v))),
      16));
}

// WeightedValues on AVX2 (Chunks = hd / 8).
template <int Chunks, int Group, typename V>
DEDIT_AVX2 inline void WeightedValuesAvx2(const V* values, int64_t visible,
                                          const float* scores, int64_t stride,
                                          const __m256* scale, float* out) {
  constexpr int64_t hd = Chunks * avx2::kLanes;
  __m256 even[Group][Chunks], odd[Group][Chunks];
  for (int g = 0; g < Group; ++g) {
    for (int c = 0; c < Chunks; ++c) {
      even[g][c] = _mm256_setzero_ps();
      odd[g][c] = _mm256_setzero_ps();
    }
  }
  int64_t j = 0;
  for (; j + 1 < visible; j += 2) {
    const V* v = values + j * hd;
    for (int g = 0; g < Group; ++g) {
      const __m256 p0 = _mm256_set1_ps(scores[g * stride + j]);
      const __m256 p1 = _mm256_set1_ps(scores[g * stride + j + 1]);
      for (int c = 0; c < Chunks; ++c) {
        even[g][c] = _mm256_fmadd_ps(p0, LoadValuesAvx2(v + c * avx2::kLanes),
                                     even[g][c]);
        odd[g][c] = _mm256_fmadd_ps(
            p1, LoadValuesAvx2(v + hd + c * avx2::kLanes), odd[g][c]);
      }
    }
  }
  if (j < visible) {
    for (int g = 0; g < Group; ++g) {
      const __m256 p0 = _mm256_set1_ps(scores[g * stride + j]);
      for (int c = 0; c < Chunks; ++c) {
        even[g][c] = _mm256_fmadd_ps(
            p0, LoadValuesAvx2(values + j * hd + c * avx2::kLanes), even[g][c]);
      }
    }
  }
  for (int g = 0; g < Group; ++g) {
    for (int c = 0; c < Chunks; ++c) {
      _mm256_storeu_ps(
          out + g * hd + c * avx2::kLanes,
          _mm256_mul_ps(_mm256_add_ps(even[g][c], odd[g][c]), scale[g]));
    }
  }
}

template <int Chunks>
DEDIT_AVX2 inline __m256 DotAvx2(const __m256* qv, const float* k) {
  __m256 acc = _mm256_mul_ps(qv[0], _mm256_loadu_ps(k));
  for (int c = 1; c < Chunks; ++c) {
    acc = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(k + c * avx2::kLanes), acc);
  }
  return acc;
}

// AttendGroup on AVX2: scores in blocks of 8 keys. Chunks = hd / 8.
template <int Chunks, int Group>
DEDIT_AVX2 void AttendGroupAvx2(const float* q, const float* keys,
                                const float* values, int64_t visible,
                                float* scores, float* out) {
  constexpr int64_t hd = Chunks * avx2::kLanes;
  constexpr int64_t kBlock = avx2::kLanes;
  const int64_t stride = (visible + kBlock - 1) / kBlock * kBlock;
  __m256 qv[Group][Chunks];
  for (int g = 0; g < Group; ++g) {
    for (int c = 0; c < Chunks; ++c) {
      qv[g][c] = _mm256_loadu_ps(q + g * hd + c * avx2::kLanes);
    }
  }
  __m256 best[Group];
  for (int g = 0; g < Group; ++g) {
    best[g] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  }
  for (int64_t j0 = 0; j0 < visible; j0 += kBlock) {
    const int64_t in_block = std::min(kBlock, visible - j0);
    LaneSumsAvx2 sums[Group];
    for (int p = 0; p < kBlock / 2; ++p) {
      const int64_t i = 2 * p;
      const float* k = keys + (j0 + i) * hd;
      for (int g = 0; g < Group; ++g) {
        const __m256 a =
            i < in_block ? DotAvx2<Chunks>(qv[g], k) : _mm256_setzero_ps();
        const __m256 b = i + 1 < in_block ? DotAvx2<Chunks>(qv[g], k + hd)
                                          : _mm256_setzero_ps();
        sums[g].Add(p, a, b);
      }
    }
    const __m256i live = avx2::LaneMask(in_block);
    for (int g = 0; g < Group; ++g) {
      _mm256_storeu_ps(scores + g * stride + j0, sums[g].sum);
      best[g] = MaxIn(best[g], sums[g].sum, live);
    }
  }
  __m256 scale[Group];
  SoftmaxAvx2<Group>(scores, stride, visible, best, scale);
  WeightedValuesAvx2<Chunks, Group>(values, visible, scores, stride, scale,
                                    out);
}

// acc += a key pair of 8 keys (k: their 8 bf16 pairs) times the query
// pair qe[0], qe[1] (f32 of bf16 values), as VDPBF16PS adds it: the odd
// product, then the even one, each exact in f32 and rounded once.
DEDIT_AVX2 inline __m256 AddBf16Pair(__m256 acc, const uint16_t* k,
                                     const float* qe) {
  const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k));
  acc = _mm256_fmadd_ps(_mm256_broadcast_ss(qe + 1), avx2::OddBf16(pairs), acc);
  return _mm256_fmadd_ps(_mm256_broadcast_ss(qe), avx2::EvenBf16(pairs), acc);
}

// AttendGroupBf16 on AVX2: the queries rounded to bf16 as f32, a 16-key
// block's scores in two ymm (keys 0-7 and 8-15) of two chains each (pairs
// 0, 2, 4, ... and 1, 3, 5, ...), each pair of a key widened to f32 and
// added as VDPBF16PS adds it (odd element, then even); then SoftmaxAvx2
// and WeightedValuesAvx2. Chunks = hd / 8, a multiple of 4.
template <int Chunks, int Group>
DEDIT_AVX2 void AttendGroupBf16Avx2(const float* q, const uint16_t* keys,
                                    const uint16_t* values, int64_t visible,
                                    float* scores, float* out) {
  static_assert(Chunks % 4 == 0, "the kernel takes head sizes of 32n");
  constexpr int Pairs = Chunks * avx2::kLanes / 2;
  constexpr int64_t hd = Chunks * avx2::kLanes;
  const int64_t stride = (visible + kLanes - 1) / kLanes * kLanes;
  alignas(32) float qr[Group][hd];
  for (int g = 0; g < Group; ++g) {
    for (int c = 0; c < hd; c += avx2::kLanes) {
      _mm256_store_ps(qr[g] + c,
                      _mm256_castsi256_ps(avx2::RoundToBf16(_mm256_castps_si256(
                          _mm256_loadu_ps(q + g * hd + c)))));
    }
  }
  __m256 best[Group];
  for (int g = 0; g < Group; ++g) {
    best[g] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  }
  for (int64_t j0 = 0; j0 < visible; j0 += kLanes) {
    const uint16_t* block = keys + j0 * hd;
    __m256 even[Group][2], odd[Group][2];
    for (int g = 0; g < Group; ++g) {
      for (int h = 0; h < 2; ++h) {
        even[g][h] = _mm256_setzero_ps();
        odd[g][h] = _mm256_setzero_ps();
      }
    }
    for (int i = 0; i < Pairs; i += 2) {
      for (int g = 0; g < Group; ++g) {
        for (int h = 0; h < 2; ++h) {
          const uint16_t* k = block + i * 2 * kLanes + h * avx2::kLanes * 2;
          even[g][h] = AddBf16Pair(even[g][h], k, qr[g] + 2 * i);
          odd[g][h] = AddBf16Pair(odd[g][h], k + 2 * kLanes, qr[g] + 2 * i + 2);
        }
      }
    }
    for (int g = 0; g < Group; ++g) {
      for (int h = 0; h < 2; ++h) {
        const __m256 sum = _mm256_add_ps(even[g][h], odd[g][h]);
        const int64_t first = j0 + h * avx2::kLanes;
        _mm256_storeu_ps(scores + g * stride + first, sum);
        best[g] = MaxIn(best[g], sum, avx2::LaneMask(visible - first));
      }
    }
  }
  __m256 scale[Group];
  SoftmaxAvx2<Group>(scores, stride, visible, best, scale);
  WeightedValuesAvx2<Chunks, Group>(values, visible, scores, stride, scale,
                                    out);
}

template <typename Kv>
using AttendFn = void (*)(const float*, const Kv*, const Kv*, int64_t, float*,
                          float*);

// Two heads at a time for an even group, else one (*heads_per_call).
// Head sizes to 112: two heads at a time are faster than one; at 128 their
// queries and accumulators no longer fit the 32 vector registers, and the
// spills make it slower, so 128 keeps one head a call (dedit-attention-bench;
// bench notebook, "Grouped-query heads in one pass"). On AVX2's 16
// registers two heads take hd 16 alone: past that, the two heads' even and
// odd value sums (4 x hd / 8 registers) no longer fit. The bf16 kernel
// (Bf16) takes even Chunks only.
template <int Chunks, bool Bf16, bool Avx2>
auto AttendChunks(int group, int* heads_per_call) {
  using Fn = AttendFn<std::conditional_t<Bf16, uint16_t, float>>;
  if constexpr (Bf16 && Chunks % 2 != 0) {
    return Fn{nullptr};
  } else {
    auto pick = [](auto per_call) -> Fn {
      constexpr int kGroup = decltype(per_call)::value;
      if constexpr (Avx2 && Bf16) {
        return &AttendGroupBf16Avx2<2 * Chunks, kGroup>;
      } else if constexpr (Avx2) {
        return &AttendGroupAvx2<2 * Chunks, kGroup>;
      } else if constexpr (Bf16) {
        return &AttendGroupBf16<Chunks, kGroup>;
      } else {
        return &AttendGroup<Chunks, kGroup>;
      }
    };
    if constexpr (Avx2 ? Chunks <= 1 : Chunks <= 7) {
      if (group % 2 == 0) {
        *heads_per_call = 2;
        return pick(std::integral_constant<int, 2>{});
      }
    }
    *heads_per_call = 1;
    return pick(std::integral_constant<int, 1>{});
  }
}

template <bool Bf16, bool Avx2>
auto AttendFor(int64_t hd, int group, int* heads_per_call) {
  switch (hd / kLanes) {
    case 1:
      return AttendChunks<1, Bf16, Avx2>(group, heads_per_call);
    case 2:
      return AttendChunks<2, Bf16, Avx2>(group, heads_per_call);
    case 3:
      return AttendChunks<3, Bf16, Avx2>(group, heads_per_call);
    case 4:
      return AttendChunks<4, Bf16, Avx2>(group, heads_per_call);
    case 5:
      return AttendChunks<5, Bf16, Avx2>(group, heads_per_call);
    case 6:
      return AttendChunks<6, Bf16, Avx2>(group, heads_per_call);
    case 7:
      return AttendChunks<7, Bf16, Avx2>(group, heads_per_call);
    case 8:
      return AttendChunks<8, Bf16, Avx2>(group, heads_per_call);
    default:
      return decltype(AttendChunks<2, Bf16, Avx2>(group, heads_per_call)){
          nullptr};
  }
}

// CpuAttention (f32 Kv) and CpuAttentionBf16 (bf16 bits, uint16_t Kv):
// picks the kernel for the head size and group, and deals the (row, run of
// heads) items to the pool's threads; each item runs it on its row's slot.
template <typename Kv>
void AttendRows(const float* q, int64_t q_row_stride,
                const CpuAttentionRows& rows, int heads, int kv_heads,
                int64_t hd, const Kv* keys, const Kv* values, int64_t slab,
                float* out, CpuProductPool* pool) {
  const int group = heads / kv_heads;
  int per_call = 1;
  constexpr bool kBf16 = std::is_same_v<Kv, uint16_t>;
  const bool avx512 = CpuIsaOf(kBf16 ? CpuProducts::kBf16
                                     : CpuProducts::kF32) == CpuIsa::kAvx512;
  const AttendFn<Kv> attend =
      avx512 ? AttendFor<kBf16, false>(hd, group, &per_call)
             : AttendFor<kBf16, true>(hd, group, &per_call);
  // Work items: (row, run of per_call heads of one kv head).
  const int calls_per_row = heads / per_call;
  const int64_t items = rows.n * calls_per_row;
  auto run = [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / calls_per_row;
      const int h = static_cast<int>(i % calls_per_row) * per_call;
      const int64_t visible = rows.visible[r];
      const int64_t need = per_call * (visible + kLanes);
      if (static_cast<int64_t>(scores.size()) < need) scores.resize(need);
      const int64_t base =
          (int64_t{rows.slot[r]} * kv_heads + h / group) * slab * hd;
      attend(q + r * q_row_stride + h * hd, keys + base, values + base, visible,
             scores.data(), out + (r * heads + h) * hd);
    }
  };
  const int parts = pool == nullptr || items < 2 ? 1 : pool->threads();
  if (parts <= 1) {
    run(0, items);
    return;
  }
  const int64_t per = (items + parts - 1) / parts;
  pool->Run(parts, [&](int part) {
    run(std::min(items, part * per), std::min(items, (part + 1) * per));
  });
}

#endif  // DEDIT_ATTENTION_X86

}  // namespace

bool CpuAttentionRuns(int64_t head_dim) {
#if DEDIT_ATTENTION_X86
  return head_dim > 0 && head_dim % 16 == 0 && head_dim <= 128 &&
         CpuRuns(CpuProducts::kF32);
#else
  (void)head_dim;
  return false;
#endif
}

bool CpuAttentionBf16Runs(int64_t head_dim) {
  return CpuAttentionRuns(head_dim) && head_dim % 32 == 0 &&
         CpuRuns(CpuProducts::kBf16);
}

namespace {

// The entry points of both K/V element types: the x86 kernels where they
// are compiled (callers check CpuAttentionRuns first).
template <typename Kv>
void AttendIfCompiled(const float* q, int64_t q_row_stride,
                      const CpuAttentionRows& rows, int heads, int kv_heads,
                      int64_t hd, const Kv* keys, const Kv* values,
                      int64_t slab, float* out, CpuProductPool* pool) {
#if DEDIT_ATTENTION_X86
  AttendRows(q, q_row_stride, rows, heads, kv_heads, hd, keys, values, slab,
             out, pool);
#else
  (void)q, (void)q_row_stride, (void)rows, (void)heads, (void)kv_heads;
  (void)hd, (void)keys, (void)values, (void)slab, (void)out, (void)pool;
#endif
}

}  // namespace

void CpuAttention(const float* q, int64_t q_row_stride,
                  const CpuAttentionRows& rows, int heads, int kv_heads,
                  int64_t hd, const float* keys, const float* values,
                  int64_t slab, float* out, CpuProductPool* pool) {
  AttendIfCompiled(q, q_row_stride, rows, heads, kv_heads, hd, keys, values,
                   slab, out, pool);
}

void CpuAttentionBf16(const float* q, int64_t q_row_stride,
                      const CpuAttentionRows& rows, int heads, int kv_heads,
                      int64_t hd, const uint16_t* keys, const uint16_t* values,
                      int64_t slab, float* out, CpuProductPool* pool) {
  AttendIfCompiled(q, q_row_stride, rows, heads, kv_heads, hd, keys, values,
                   slab, out, pool);
}

}  // namespace dedit
