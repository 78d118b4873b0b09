// AVX2+FMA math shared by this project's CPU kernels
// (common/model/cpu/cpu_panels.cc, common/model/cpu/cpu_attention.cc): the
// 8-lane counterparts of common/model/cpu/cpu_avx512_math.h, for CPUs
// without AVX-512 (Zen 2/3, Haswell to Comet Lake).
// Internal: include only from files whose callers check the CPU first
// (CpuRuns, common/model/cpu/cpu_panels.h), and only on x86-64.
#ifndef DEDIT_MODEL_CPU_AVX2_MATH_H_
#define DEDIT_MODEL_CPU_AVX2_MATH_H_

#include <immintrin.h>

#include <cstdint>

#include "common/model/cpu/cpu_exp_constants.h"

// As DEDIT_AVX512: the kernels alone are built for AVX2 and FMA.
#define DEDIT_AVX2 __attribute__((target("avx2,fma")))

namespace dedit::avx2 {

constexpr int64_t kLanes = 8;

// The first `lanes` lanes of 8 set to all ones (all of them for 8 or
// more, none for 0 or fewer): VMASKMOVPS's mask of a partial vector.
DEDIT_AVX2 inline __m256i LaneMask(int64_t lanes) {
  const int32_t live =
      static_cast<int32_t>(lanes >= kLanes ? kLanes : (lanes <= 0 ? 0 : lanes));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(live),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 floats from p, of which the first `lanes` are read (the rest 0).
DEDIT_AVX2 inline __m256 LoadFirst(const float* p, int64_t lanes) {
  return lanes >= kLanes ? _mm256_loadu_ps(p)
                         : _mm256_maskload_ps(p, LaneMask(lanes));
}

// v's first `lanes` lanes to p.
DEDIT_AVX2 inline void StoreFirst(float* p, int64_t lanes, __m256 v) {
  if (lanes >= kLanes) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, LaneMask(lanes), v);
  }
}

// The sum of the 8 lanes, always in the same order: halves, then pairs.
DEDIT_AVX2 inline float ReduceAdd(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

DEDIT_AVX2 inline float ReduceMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// e^x per lane: avx512::Exp's clamp, reduction and polynomial (the
// constants of common/model/cpu/cpu_exp_constants.h), with 2^n
// built in the exponent field (n is in [-126, 127] after the clamp, so the
// field never overflows) where AVX-512 has VSCALEFPS. Both multiply p by
// an exact 2^n with one rounding, so the two agree to the bit.
DEDIT_AVX2 inline __m256 Exp(__m256 x) {
  using namespace cpu_exp;
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kMin)),
                    _mm256_set1_ps(kMax));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Low), r);
  __m256 p = _mm256_set1_ps(kPoly[0]);
  for (int i = 1; i < kPolyDegree; ++i)
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kPoly[i]));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r,
                      _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i two_n = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

// f32 lanes (as bits) rounded to bf16 as VCVTNE2PS2BF16 rounds: to nearest
// even, zeros and denormals to a zero of their sign, NaN kept a quiet NaN.
// The bf16 is in the high half of each lane, the low half 0: the lane is
// also the rounded value as an f32.
DEDIT_AVX2 inline __m256i RoundToBf16(__m256i u) {
  const __m256i lsb =
      _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r =
      _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256i exponent = _mm256_and_si256(u, _mm256_set1_epi32(0x7f800000));
  const __m256i tiny = _mm256_cmpeq_epi32(exponent, _mm256_setzero_si256());
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                         _mm256_set1_epi32(0x7f800000));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)),
                         nan);
  r = _mm256_blendv_epi8(
      r, _mm256_and_si256(u, _mm256_set1_epi32(int32_t{-0x7fffffff - 1})),
      tiny);
  return _mm256_and_si256(r, _mm256_set1_epi32(int32_t{-0x10000}));
}

// bf16 pairs (uint32 lanes, element 2i in the low half) widened to f32,
// exactly: the even elements and the odd ones.
DEDIT_AVX2 inline __m256 EvenBf16(__m256i pairs) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
}
DEDIT_AVX2 inline __m256 OddBf16(__m256i pairs) {
  return _mm256_castsi256_ps(
      _mm256_and_si256(pairs, _mm256_set1_epi32(int32_t{-0x10000})));
}

}  // namespace dedit::avx2

#endif  // DEDIT_MODEL_CPU_AVX2_MATH_H_
