// AVX-512 math shared by this project's CPU kernels
// (common/model/cpu/cpu_panels.cc, common/model/cpu/cpu_attention.cc).
// Internal: include only from files whose callers check the CPU first (CpuRuns,
// common/model/cpu/cpu_panels.h), and only on x86-64.
#ifndef DEDIT_MODEL_CPU_AVX512_MATH_H_
#define DEDIT_MODEL_CPU_AVX512_MATH_H_

#include <immintrin.h>

#include "common/model/cpu/cpu_exp_constants.h"

// The kernels alone are built for AVX-512: the rest of the binary keeps the
// baseline ISA. DEDIT_AVX512_BF16 only where AVX512_BF16 instructions are
// used (CpuRuns(kBf16) checks it; kF32 and the attention do not need it).
#define DEDIT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define DEDIT_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace dedit::avx512 {

// The first `lanes` lanes of 16 (all of them for 16 or more, none for 0 or
// fewer): the mask of a partial last vector.
DEDIT_AVX512 inline __mmask16 LaneMask(int64_t lanes) {
  if (lanes >= 16) return 0xffff;
  if (lanes <= 0) return 0;
  return static_cast<__mmask16>((1u << lanes) - 1u);
}

// e^x per lane, x clamped to [-87, 88] (Cephes' expf: x = n ln2 + r,
// |r| <= ln2 / 2, a degree-6 polynomial in r, scaled by 2^n; the constants
// in common/model/cpu/cpu_exp_constants.h). Relative error ~2e-7. Each lane's
// value depends on that lane alone.
DEDIT_AVX512 inline __m512 Exp(__m512 x) {
  using namespace cpu_exp;
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kMin)),
                    _mm512_set1_ps(kMax));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), r);
  __m512 p = _mm512_set1_ps(kPoly[0]);
  for (int i = 1; i < kPolyDegree; ++i)
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPoly[i]));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r,
                      _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

}  // namespace dedit::avx512

#endif  // DEDIT_MODEL_CPU_AVX512_MATH_H_
