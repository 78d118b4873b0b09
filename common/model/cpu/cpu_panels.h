// Weight products on the CPU over weights packed once at load ("panels"),
// with AVX-512 and AVX2+FMA kernels written here.
//
// Why by hand: a model forward of the tiny pair is 49 products of a few
// rows (a decode step, a verify block, a drafter block) by a weight of
// 128-768 columns, 10 MB of f32 weights in all. Debian's OpenBLAS (0.3.21)
// packs the weight on every call of its general kernel and reads the [k, n]
// row-major weight with strides on its small-matrix one; libtorch 1.13 has
// no prepacked CPU linear in Debian's build (no oneDNN/FBGEMM). Packing the
// weight once, 16 columns at a time in k order, lets one kernel read it front
// to back. On the 49 products of a 12-layer forward with distinct weights per
// layer, one thread, f32 panels beat OpenBLAS at 1, 9 and 16 rows, and bf16
// panels beat f32 panels again (docs/log/2026-12-06-bench-notebook.md, "Weight
// panels and row attention").
//
// bf16 panels round weights and the activation row to bf16 (round to
// nearest even) and sum products in f32. That is what a GPU serving the
// same bf16 checkpoint does, and it halves the weight bytes a forward
// streams. With AVX512_BF16 a pair of k is one dot product (VDPBF16PS);
// AVX2 has none and widens each bf16 to f32 (a 16-bit shift, exact), then
// adds the pair's odd product and its even one with two FMAs, the order of
// VDPBF16PS's definition (each product of two bf16 is exact in f32). f32
// panels keep f32 operands, each output one FMA chain in k order on either
// ISA (so AVX2 and AVX-512 f32 panels agree to the bit); their sums run in
// another order than OpenBLAS's, so results differ from at::mm by float
// rounding only.
//
// Every output row is summed in the same order whatever the number of rows
// in the product and whichever columns a thread takes, so a verify row is
// bit-identical to the decode step of the same token.
//
// Both ISAs read one packed layout: columns in groups of 16, one zmm or
// two ymm. kF32 and kBf16 name a precision; each runs on the widest ISA
// this CPU has for it (CpuIsaOf), chosen per call, so a process on one CPU
// always sums a row one way.
//
// Which kernel a process uses is process-wide (the binaries'
// --cpu_products), read when a model is loaded (PackForThisProcess): set it
// before loading. CpuMm / CpuAddmm (common/model/cpu/cpu_kernels.h) take the
// panels.
#ifndef DEDIT_MODEL_CPU_PANELS_H_
#define DEDIT_MODEL_CPU_PANELS_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/model/cpu/huge_pages.h"

namespace dedit {

class CpuProductPool;

enum class CpuProducts {
  kBlas,  // libtorch's mm (OpenBLAS), the reference
  kF32,   // f32 panels (AVX-512F, else AVX2+FMA)
  kBf16,  // bf16 panels (AVX512_BF16, else AVX2+FMA)
};

std::string_view CpuProductsName(CpuProducts kind);
// Whether this CPU runs `kind` (kBlas: always).
bool CpuRuns(CpuProducts kind);

// The x86 vector extensions a kind's kernels run on, narrowest first.
enum class CpuIsa {
  kNone,    // none: kBlas, or a CPU without AVX2 and FMA
  kAvx2,    // AVX2 and FMA
  kAvx512,  // AVX-512F/BW/VL, and AVX512_BF16 for kBf16
};
std::string_view CpuIsaName(CpuIsa isa);
// The ISA of `kind`'s kernels on this CPU: the widest it runs, within the
// cap below. The kernels around the panels follow the kind whose values
// they handle: PanelSiluMul, CpuArgmaxConfidence and CpuAttention that of
// kF32; CpuFloatsToBf16 and CpuAttentionBf16 that of kBf16.
CpuIsa CpuIsaOf(CpuProducts kind);
// Tests: no kernel runs on an ISA wider than `cap` (kAvx512, the default,
// caps nothing), so a CPU with AVX-512 runs the AVX2 kernels too; kNone
// leaves only kBlas. Set it while no product runs, as SetCpuProducts.
void SetCpuIsaCapForTesting(CpuIsa cap);

void SetCpuProducts(CpuProducts kind);
CpuProducts GetCpuProducts();
// The fastest kernel this CPU runs: bf16, else f32, else blas.
CpuProducts BestCpuProducts();
// --cpu_products: "auto" (BestCpuProducts, the binaries' default), "blas",
// "f32" or "bf16". INVALID_ARGUMENT naming `flag` for another name,
// FAILED_PRECONDITION for a kernel this CPU cannot run (a tool that takes
// the kernel under another flag passes its name).
absl::Status SetCpuProductsFlag(std::string_view name,
                                std::string_view flag = "--cpu_products");

// silu(gu[:, :I]) * gu[:, I:] for gu [n, 2I] (the packed gate/up
// product), row-major, into out [n, I], with the vectorised exp of
// common/model/cpu/cpu_avx512_math.h (or its AVX2 twin, the same to the bit):
// each element from its own inputs alone, so a row is the same in any batch.
// What the decoder layers run on panels. REQUIRES CpuRuns(CpuProducts::kF32).
void PanelSiluMul(const float* gu, int64_t n, int64_t inter, float* out);

// out[i] = x[i] rounded to bf16 (to nearest even, denormals to zero, as
// VCVTNE2PS2BF16; the AVX2 kernel gives the same bits), i < n: how bf16
// panels round their activation rows and a bf16 K/V pool its keys and values
// (common/model/kv_pool.h). REQUIRES CpuRuns(CpuProducts::kBf16).
void CpuFloatsToBf16(const float* x, int64_t n, uint16_t* out);

// For each of n rows of `vocab` finite fp32 logits: argmax[r], the first
// index of the row's largest logit (at::max's choice), and confidence[r]
// = 1 / sum(exp(l - max)), the largest softmax probability (the drafter's
// confidence), in one vector pass for each, with
// common/model/cpu/cpu_avx512_math.h's exp (or its AVX2 twin). REQUIRES
// CpuRuns(CpuProducts::kF32).
void CpuArgmaxConfidence(const float* logits, int64_t n, int64_t vocab,
                         int64_t* argmax, float* confidence);

class CpuPanels {
 public:
  // `w` ([k, n]: fp32, on the CPU, contiguous) packed for `kind`, or null
  // when kind is kBlas, w does not fit, or the CPU cannot run the kernel.
  // Copies the values: later changes to w are not seen.
  static std::shared_ptr<const CpuPanels> Pack(const at::Tensor& w,
                                               CpuProducts kind);
  static std::shared_ptr<const CpuPanels> PackForThisProcess(
      const at::Tensor& w);

  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  CpuProducts kind() const { return kind_; }
  int64_t bytes() const;

  // y = x @ w, or bias + x @ w when bias is not null. x: [m, k], bias and
  // y: [m, n], all row-major fp32. With a pool, the column groups are dealt
  // to its threads (for one row, only when w is larger than a core's L2).
  // Each weight tile is read once for all m rows.
  void Multiply(const float* x, int64_t m, const float* bias, float* y,
                CpuProductPool* pool) const;
  // Multiply calls so far in this process (tests and benchmarks check that
  // a model's products ran on panels).
  static int64_t products_run();

 private:
  CpuPanels(CpuProducts kind, int64_t k, int64_t n);
  // Columns [16 * g0, 16 * g1) of every row on `isa`'s kernels; bf16
  // panels read `rounded`, the rows rounded to bf16 (Multiply).
  void MultiplyGroups(CpuIsa isa, const float* x, const void* rounded,
                      int64_t m, const float* bias, float* y, int64_t g0,
                      int64_t g1) const;

  CpuProducts kind_;
  int64_t k_, n_;
  int64_t groups_;  // ceil(n / 16)
  int64_t pairs_;   // ceil(k / 2), bf16 only
  // f32: [groups][k][16]; bf16: [groups][pairs][16][2] (as uint16).
  // On 2 MB pages where they are large (common/model/cpu/huge_pages.h).
  LargeArray<float> f32_;
  LargeArray<uint16_t> bf16_;
};

}  // namespace dedit

#endif  // DEDIT_MODEL_CPU_PANELS_H_
