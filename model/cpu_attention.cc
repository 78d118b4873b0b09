#include "model/cpu_attention.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "model/cpu_panels.h"
#include "model/cpu_product_pool.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define DEDIT_ATTENTION_X86 1
#include "model/cpu_avx512_math.h"
#else
#define DEDIT_ATTENTION_X86 0
#endif

namespace dedit {
namespace {

#if DEDIT_ATTENTION_X86

constexpr int64_t kLanes = 16;

using avx512::Exp;

// Lane i of the result = the sum of t[i]'s 16 lanes (a transpose-reduce
// tree: the same adds in the same order for every block).
DEDIT_AVX512 inline __m512 SumEach(const __m512* t) {
  __m512 s[8];
  for (int i = 0; i < 8; ++i) {
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(t[2 * i], t[2 * i + 1]),
                         _mm512_unpackhi_ps(t[2 * i], t[2 * i + 1]));
  }
  __m512 u[4];
  for (int i = 0; i < 4; ++i) {
    u[i] = _mm512_add_ps(
        _mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
        _mm512_shuffle_ps(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  const __m512 w01 =
      _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                    _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 w23 =
      _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                    _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// One (row, head): q [hd], keys / values [visible, hd] rows of one slab,
// out [hd]. scores: room for visible rounded up to 16.
// Chunks = hd / 16, a template argument so that the query and the
// accumulators stay in registers.
template <int Chunks>
DEDIT_AVX512 void AttendOne(const float* q, const float* keys,
                            const float* values, int64_t visible, float* scores,
                            float* out) {
  constexpr int64_t chunks = Chunks, hd = Chunks * kLanes;
  __m512 qv[Chunks];
  for (int64_t c = 0; c < chunks; ++c) qv[c] = _mm512_loadu_ps(q + c * kLanes);
  // Scores, 16 keys per block from key 0; keys past `visible` are not read.
  __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j0 = 0; j0 < visible; j0 += kLanes) {
    const int64_t in_block = std::min(kLanes, visible - j0);
    __m512 t[kLanes];
    for (int64_t i = 0; i < kLanes; ++i) {
      if (i >= in_block) {
        t[i] = _mm512_setzero_ps();
        continue;
      }
      const float* k = keys + (j0 + i) * hd;
      __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
      for (int64_t c = 1; c < chunks; ++c) {
        acc = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + c * kLanes), acc);
      }
      t[i] = acc;
    }
    const __mmask16 live = avx512::LaneMask(in_block);
    const __m512 s = SumEach(t);
    _mm512_storeu_ps(scores + j0, s);
    best = _mm512_mask_max_ps(best, live, best, s);
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(best));
  __m512 total = _mm512_setzero_ps();
  for (int64_t j0 = 0; j0 < visible; j0 += kLanes) {
    const int64_t in_block = std::min(kLanes, visible - j0);
    const __mmask16 live = avx512::LaneMask(in_block);
    const __m512 p = _mm512_maskz_mov_ps(
        live, Exp(_mm512_sub_ps(_mm512_loadu_ps(scores + j0), m)));
    _mm512_storeu_ps(scores + j0, p);
    total = _mm512_add_ps(total, p);
  }
  // Even and odd keys in two sums, added at the end: two FMA chains.
  __m512 even[Chunks], odd[Chunks];
  for (int64_t c = 0; c < chunks; ++c) {
    even[c] = _mm512_setzero_ps();
    odd[c] = _mm512_setzero_ps();
  }
  int64_t j = 0;
  for (; j + 1 < visible; j += 2) {
    const __m512 p0 = _mm512_set1_ps(scores[j]);
    const __m512 p1 = _mm512_set1_ps(scores[j + 1]);
    const float* v = values + j * hd;
    for (int64_t c = 0; c < chunks; ++c) {
      even[c] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v + c * kLanes), even[c]);
      odd[c] =
          _mm512_fmadd_ps(p1, _mm512_loadu_ps(v + hd + c * kLanes), odd[c]);
    }
  }
  if (j < visible) {
    const __m512 p0 = _mm512_set1_ps(scores[j]);
    for (int64_t c = 0; c < chunks; ++c) {
      even[c] = _mm512_fmadd_ps(
          p0, _mm512_loadu_ps(values + j * hd + c * kLanes), even[c]);
    }
  }
  const __m512 scale = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total));
  for (int64_t c = 0; c < chunks; ++c) {
    _mm512_storeu_ps(out + c * kLanes,
                     _mm512_mul_ps(_mm512_add_ps(even[c], odd[c]), scale));
  }
}

using AttendFn = void (*)(const float*, const float*, const float*, int64_t,
                          float*, float*);
AttendFn AttendFor(int64_t hd) {
  switch (hd / kLanes) {
    case 1:
      return &AttendOne<1>;
    case 2:
      return &AttendOne<2>;
    case 3:
      return &AttendOne<3>;
    case 4:
      return &AttendOne<4>;
    case 5:
      return &AttendOne<5>;
    case 6:
      return &AttendOne<6>;
    case 7:
      return &AttendOne<7>;
    case 8:
      return &AttendOne<8>;
    default:
      return nullptr;
  }
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

void CpuAttention(const float* q, int64_t q_row_stride,
                  const CpuAttentionRows& rows, int heads, int kv_heads,
                  int64_t hd, const float* keys, const float* values,
                  int64_t slab, float* out, CpuProductPool* pool) {
#if DEDIT_ATTENTION_X86
  const int group = heads / kv_heads;
  const int64_t pairs = rows.n * heads;
  const AttendFn attend = AttendFor(hd);
  auto run = [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / heads;
      const int h = static_cast<int>(i % heads);
      const int64_t visible = rows.visible[r];
      if (static_cast<int64_t>(scores.size()) < visible + kLanes) {
        scores.resize(visible + kLanes);
      }
      const int64_t base =
          (int64_t{rows.slot[r]} * kv_heads + h / group) * slab * hd;
      attend(q + r * q_row_stride + h * hd, keys + base, values + base, visible,
             scores.data(), out + (r * heads + h) * hd);
    }
  };
  const int parts = pool == nullptr || pairs < 2 ? 1 : pool->threads();
  if (parts <= 1) {
    run(0, pairs);
    return;
  }
  const int64_t per = (pairs + parts - 1) / parts;
  pool->Run(parts, [&](int part) {
    run(std::min(pairs, part * per), std::min(pairs, (part + 1) * per));
  });
#else
  (void)q, (void)q_row_stride, (void)rows, (void)heads, (void)kv_heads;
  (void)hd, (void)keys, (void)values, (void)slab, (void)out, (void)pool;
#endif
}

}  // namespace dedit
