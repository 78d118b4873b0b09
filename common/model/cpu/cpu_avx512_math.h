// AVX-512 math shared by this project's CPU kernels
// (common/model/cpu/cpu_panels.cc, common/model/cpu/cpu_attention.cc).
// Internal: include only from files whose callers check the CPU first (CpuRuns,
// common/model/cpu/cpu_panels.h), and only on x86-64.
#ifndef DEDIT_MODEL_CPU_AVX512_MATH_H_
#define DEDIT_MODEL_CPU_AVX512_MATH_H_

#include <immintrin.h>

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
// |r| <= ln2 / 2, a degree-6 polynomial in r, scaled by 2^n). Relative
// error ~2e-7. Each lane's value depends on that lane alone.
DEDIT_AVX512 inline __m512 Exp(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)),
                    _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(
      _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r,
                      _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

}  // namespace dedit::avx512

#endif  // DEDIT_MODEL_CPU_AVX512_MATH_H_
