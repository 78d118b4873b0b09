// The constants of the vector e^x shared by the AVX-512 and AVX2 kernels
// (avx512::Exp in common/model/cpu/cpu_avx512_math.h, avx2::Exp in
// common/model/cpu/cpu_avx2_math.h): one copy, so that the two stay equal
// to the bit (tests/model/cpu_panels_test.cc checks it across ISAs).
// Cephes' expf: x clamped to [kMin, kMax], x = n ln2 + r with ln2 split in
// a short high part (exact times n) and a low correction, |r| <= ln2 / 2,
// then e^r ~ 1 + r + r^2 (((((kPoly[0] r + kPoly[1]) r + ...) + kPoly[5]).
#ifndef DEDIT_MODEL_CPU_EXP_CONSTANTS_H_
#define DEDIT_MODEL_CPU_EXP_CONSTANTS_H_

namespace dedit::cpu_exp {

inline constexpr float kMin = -87.0f;
inline constexpr float kMax = 88.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2High = 0.693359375f;
inline constexpr float kLn2Low = -2.12194440e-4f;
inline constexpr int kPolyDegree = 6;
inline constexpr float kPoly[kPolyDegree] = {
    1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
    4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

}  // namespace dedit::cpu_exp

#endif  // DEDIT_MODEL_CPU_EXP_CONSTANTS_H_
