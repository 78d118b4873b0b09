// Fused CPU kernels for the small elementwise steps of a decoder layer.
//
// libtorch 1.13 (Debian's, CPU) has no fused RMSNorm, RoPE or SwiGLU: each
// is 3-6 ATen ops, and at decode a tiny model's layer is dispatch-bound,
// so those ops cost more than the matmuls (docs/ARCHITECTURE.md §2;
// docs/log/2026-12-06-bench-notebook.md, "Engine efficiency"). These loops do
// each step in one pass and one allocation. They apply to contiguous fp32 CPU
// tensors only; everything else (bf16, CUDA) keeps the ATen composition in
// common/model/transformer_ops.cc, which is also the reference they are tested
// against (tests/model/cpu_kernels_test.cc).
#ifndef DEDIT_MODEL_CPU_KERNELS_H_
#define DEDIT_MODEL_CPU_KERNELS_H_

#include <ATen/Tensor.h>

#include <cstdint>

namespace dedit {

class CpuPanels;

// Whether the kernels below take `t`: fp32, on the CPU, contiguous, and
// grad mode off (inference; the loops have no backward).
bool CpuKernelsApply(const at::Tensor& t);

// x * rsqrt(mean(x^2) + eps) over the last dimension of x. REQUIRES
// CpuKernelsApply(x).
at::Tensor CpuRmsNormalize(const at::Tensor& x, double eps);
// The same on raw rows: x, out [rows, d], row-major fp32 (one thread).
void CpuRmsNormalizeRows(const float* x, int64_t rows, int64_t d, double eps,
                         float* out);

// Per-head RMSNorm with weight, then NeoX rotary embedding, of the first
// `heads` heads of each row of `qkv` ([n, >= heads * head_dim], the packed
// q/k/v projection). weight: [heads, head_dim]; cos, sin: n rows of
// head_dim ([n, head_dim] or [n, 1, head_dim]). Returns [n, heads,
// head_dim]. REQUIRES CpuKernelsApply of every tensor.
at::Tensor CpuHeadNormRope(const at::Tensor& qkv, int64_t heads,
                           int64_t head_dim, const at::Tensor& weight,
                           double eps, const at::Tensor& cos,
                           const at::Tensor& sin);
// The same on raw rows: n rows of qkv at row_stride, weight [heads,
// head_dim], cos and sin [n, head_dim], out [n, heads, head_dim]; one
// thread. REQUIRES head_dim even and <= 512.
void CpuHeadNormRopeRows(const float* qkv, int64_t n, int64_t row_stride,
                         int64_t heads, int64_t head_dim, const float* weight,
                         double eps, const float* cos, const float* sin,
                         float* out);

// silu(gu[:, :I]) * gu[:, I:] for gu [n, 2I] (packed gate/up). REQUIRES
// CpuKernelsApply(gu).
at::Tensor CpuSiluMul(const at::Tensor& gu);
// Whether CpuSiluMul beats ATen's silu and mul on `gu`: its exp is scalar
// libm while ATen's is vectorised (Sleef), so only for small tensors (a
// decode step of a few sequences), where the two extra ops cost more.
bool CpuSiluMulPays(const at::Tensor& gu);

// x @ w and bias + x @ w for x [m, k] and w [k, n] (a packed, transposed
// weight). Debian's OpenBLAS (0.3.21, SkylakeX kernels) runs a product
// whose m * k * n is at most 100^3 on its small-matrix kernel, which reads
// the operands in place, and a larger one on the general kernel, which
// first copies (packs) the weight, on every call. For the few rows of a
// verify block, a drafter block or a small decode batch the copy costs
// more than the multiply: on one thread, 16 x 128 by 128 x 768 and the
// 128 x 2048 output head (8 or 16 rows) each ran faster as column blocks
// than as one product (docs/log/2026-12-06-bench-notebook.md, "Products of few
// rows in column blocks"). So these split w into column blocks that each stay
// on the small kernel, writing into column slices of one output, when x has few
// rows (for many rows the general kernel is the faster one). Anything else, and
// operands the kernels above do not take, is one at::mm / at::addmm: the
// results are the same products, equal up to float rounding.
//
// With `panels` (w packed by CpuPanels::Pack, common/model/cpu/cpu_panels.h),
// an operand the kernels take runs on the panels instead, its columns dealt to
// the thread's product pool.
at::Tensor CpuMm(const at::Tensor& x, const at::Tensor& w,
                 const CpuPanels* panels = nullptr);
at::Tensor CpuAddmm(const at::Tensor& bias, const at::Tensor& x,
                    const at::Tensor& w, const CpuPanels* panels = nullptr);
// The column block CpuMm uses for an [m, k] x [k, n] product, or n when it
// runs as one product.
int64_t CpuMmColumnBlock(int64_t m, int64_t k, int64_t n);

}  // namespace dedit

#endif  // DEDIT_MODEL_CPU_KERNELS_H_
