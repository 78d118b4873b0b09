#include "common/model/cpu/cpu_kernels.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/model/cpu/cpu_panels.h"
#include "common/model/cpu/cpu_product_pool.h"

namespace dedit {
namespace {

// Rows per parallel_for task: the rows are short (one head or one hidden
// state), so only long prefills split.
constexpr int64_t kGrainRows = 64;

// Sum of squares of n floats, in four independent lanes so that the
// compiler can vectorise it without reassociating on its own.
inline float SumOfSquares(const float* x, int64_t n) {
  float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += x[i] * x[i];
    s1 += x[i + 1] * x[i + 1];
    s2 += x[i + 2] * x[i + 2];
    s3 += x[i + 3] * x[i + 3];
  }
  for (; i < n; ++i) s0 += x[i] * x[i];
  return (s0 + s1) + (s2 + s3);
}

inline float InverseRms(const float* x, int64_t n, double eps) {
  return static_cast<float>(
      1.0 / std::sqrt(static_cast<double>(SumOfSquares(x, n)) / n + eps));
}

}  // namespace

bool CpuKernelsApply(const at::Tensor& t) {
  // No autograd through the loops: the trainer's forward (grad mode on)
  // keeps the ATen composition.
  return !at::GradMode::is_enabled() && t.defined() && t.device().is_cpu() &&
         t.scalar_type() == at::kFloat && t.is_contiguous();
}

void CpuRmsNormalizeRows(const float* x, int64_t rows, int64_t d, double eps,
                         float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    float* yr = out + r * d;
    const float inv = InverseRms(xr, d, eps);
    for (int64_t j = 0; j < d; ++j) yr[j] = xr[j] * inv;
  }
}

at::Tensor CpuRmsNormalize(const at::Tensor& x, double eps) {
  const int64_t d = x.size(-1);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  at::Tensor out = at::empty_like(x);
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, kGrainRows, [&](int64_t begin, int64_t end) {
    CpuRmsNormalizeRows(in + begin * d, end - begin, d, eps, o + begin * d);
  });
  return out;
}

void CpuHeadNormRopeRows(const float* qkv, int64_t n, int64_t row_stride,
                         int64_t heads, int64_t head_dim, const float* weight,
                         double eps, const float* cos, const float* sin,
                         float* out) {
  const int64_t half = head_dim / 2;
  float y[512];  // one normalised head; head_dim <= 512 (the callers check)
  for (int64_t t = 0; t < n; ++t) {
    const float* ct = cos + t * head_dim;
    const float* st = sin + t * head_dim;
    for (int64_t h = 0; h < heads; ++h) {
      const float* xh = qkv + t * row_stride + h * head_dim;
      const float* wh = weight + h * head_dim;
      float* oh = out + (t * heads + h) * head_dim;
      const float inv = InverseRms(xh, head_dim, eps);
      for (int64_t j = 0; j < head_dim; ++j) y[j] = xh[j] * inv * wh[j];
      // rotate_half(y) = [-y2, y1]
      for (int64_t j = 0; j < half; ++j) {
        oh[j] = y[j] * ct[j] - y[j + half] * st[j];
        oh[j + half] = y[j + half] * ct[j + half] + y[j] * st[j + half];
      }
    }
  }
}

at::Tensor CpuHeadNormRope(const at::Tensor& qkv, int64_t heads,
                           int64_t head_dim, const at::Tensor& weight,
                           double eps, const at::Tensor& cos,
                           const at::Tensor& sin) {
  TORCH_CHECK(head_dim % 2 == 0 && head_dim <= 512,
              "CpuHeadNormRope: head_dim ", head_dim,
              " must be even and at most 512");
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) >= heads * head_dim,
              "CpuHeadNormRope: qkv rows hold fewer than ", heads, " heads");
  TORCH_CHECK(weight.numel() == heads * head_dim,
              "CpuHeadNormRope: weight is not [heads, head_dim]");
  TORCH_CHECK(
      cos.numel() == qkv.size(0) * head_dim && sin.numel() == cos.numel(),
      "CpuHeadNormRope: cos/sin are not one head_dim row per token");
  const int64_t n = qkv.size(0);
  const int64_t row = qkv.size(1);
  at::Tensor out = at::empty({n, heads, head_dim}, qkv.options());
  const float* in = qkv.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, n, kGrainRows, [&](int64_t begin, int64_t end) {
    CpuHeadNormRopeRows(in + begin * row, end - begin, row, heads, head_dim, w,
                        eps, c + begin * head_dim, s + begin * head_dim,
                        o + begin * heads * head_dim);
  });
  return out;
}

bool CpuSiluMulPays(const at::Tensor& gu) {
  // A version that always looped was slower in speculative batches
  // (dedit-engine-bench, docs/log/2026-12-06-bench-notebook.md, "Fused CPU
  // kernels"); at decode a few hundred scalar exps cost less than ATen's
  // two extra ops.
  constexpr int64_t kMaxElements = 4096;
  return CpuKernelsApply(gu) && gu.numel() <= kMaxElements;
}

at::Tensor CpuSiluMul(const at::Tensor& gu) {
  const int64_t n = gu.size(0);
  const int64_t inter = gu.size(1) / 2;
  at::Tensor out = at::empty({n, inter}, gu.options());
  const float* in = gu.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, n, kGrainRows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = in + r * 2 * inter;
      const float* u = g + inter;
      float* y = o + r * inter;
      for (int64_t j = 0; j < inter; ++j) {
        y[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
      }
    }
  });
  return out;
}

namespace {

// Past 32 rows splitting a product by columns stopped paying (64 x 128 x
// 768 ran slower split than as one product;
// docs/log/2026-12-06-bench-notebook.md, "Products of few rows in column
// blocks"), and blocks under 16 columns waste the small kernel's vector
// width. CpuMmColumnBlock's blocks and the product pool's ranges are both
// made of whole 16-column groups.
constexpr int64_t kMaxRows = 32, kMinColumns = 16;

}  // namespace

int64_t CpuMmColumnBlock(int64_t m, int64_t k, int64_t n) {
  // OpenBLAS's small-matrix limit (sgemm_small_kernel_permit, SkylakeX):
  // m * n * k <= 100^3. Past it a product takes the general kernel, which packs
  // the weight on every call, so 12 x 128 x 768 (1.18M) costs several times
  // what 10 x 128 x 768 (983k) does (docs/log/2026-12-06-bench-notebook.md,
  // "Products of few rows in column blocks").
  constexpr int64_t kSmallProduct = 1000000;
  if (m <= 0 || k <= 0 || m * k * n <= kSmallProduct || m > kMaxRows) return n;
  const int64_t block = kSmallProduct / (m * k) / kMinColumns * kMinColumns;
  return block < kMinColumns ? n : std::min(block, n);
}

namespace {

// The column block to split x @ w into, or 0 to run it as one product
// (operands the kernels do not take, or a split that does not pay).
int64_t SplitBlock(const at::Tensor& x, const at::Tensor& w) {
  if (x.dim() != 2 || w.dim() != 2 || !CpuKernelsApply(x) ||
      !CpuKernelsApply(w)) {
    return 0;
  }
  const int64_t block = CpuMmColumnBlock(x.size(0), x.size(1), w.size(1));
  return block < w.size(1) ? block : 0;
}

// `one(out[:, j:j+b], j, b)` for the blocks of at most `block` columns
// that cover columns [begin, end).
template <typename One>
void EachColumnBlock(const at::Tensor& out, int64_t begin, int64_t end,
                     int64_t block, One& one) {
  for (int64_t j = begin; j < end; j += block) {
    const int64_t b = std::min(block, end - j);
    one(out.narrow(1, j, b), j, b);
  }
}

// One [x.size(0), w.size(1)] output, filled block by block.
template <typename One>
at::Tensor ByColumnBlocks(const at::Tensor& x, const at::Tensor& w,
                          int64_t block, One one) {
  at::Tensor out = at::empty({x.size(0), w.size(1)}, x.options());
  EachColumnBlock(out, 0, w.size(1), block, one);
  return out;
}

// The calling thread's product pool when x @ w is a few-row product it
// takes (common/model/cpu/cpu_product_pool.h), else null.
CpuProductPool* PoolFor(const at::Tensor& x, const at::Tensor& w) {
  // One row (a decode step of one sequence) is left alone: its products
  // take a few microseconds each, and handing half of each to a helper
  // made a decode step slower (docs/log/2026-12-06-bench-notebook.md,
  // "Few-row products on two cores").
  constexpr int64_t kMinRows = 2;
  if (CpuProductThreads() <= 1 || x.dim() != 2 || w.dim() != 2 ||
      x.size(0) < kMinRows || x.size(0) > kMaxRows ||
      w.size(1) < 2 * kMinColumns || !CpuKernelsApply(x) ||
      !CpuKernelsApply(w)) {
    return nullptr;
  }
  return CpuProductPool::ForThisThread();
}

// Like ByColumnBlocks, with the columns dealt into one range of whole
// kMinColumns groups per pool thread; each range runs in blocks of at most
// CpuMmColumnBlock's size, so every block stays on the small kernel.
template <typename One>
at::Tensor ByColumnRanges(CpuProductPool* pool, const at::Tensor& x,
                          const at::Tensor& w, One one) {
  const int64_t n = w.size(1);
  const int64_t block = CpuMmColumnBlock(x.size(0), x.size(1), n);
  const int parts = pool->threads();
  const int64_t range =
      ((n + parts - 1) / parts + kMinColumns - 1) / kMinColumns * kMinColumns;
  at::Tensor out = at::empty({x.size(0), n}, x.options());
  pool->Run(parts, [&](int part) {
    EachColumnBlock(out, part * range, std::min(n, (part + 1) * range), block,
                    one);
  });
  return out;
}

// Whether x @ w runs on `panels`.
bool PanelsTake(const at::Tensor& x, const CpuPanels* panels) {
  return panels != nullptr && x.dim() == 2 && CpuKernelsApply(x) &&
         x.size(1) == panels->k();
}

// [bias +] x @ w on the panels, with the calling thread's product pool
// when it has one (CpuPanels::Multiply decides whether a product splits).
at::Tensor PanelProduct(const at::Tensor* bias, const at::Tensor& x,
                        const CpuPanels& panels) {
  const int64_t m = x.size(0);
  at::Tensor out = at::empty({m, panels.n()}, x.options());
  panels.Multiply(x.data_ptr<float>(), m,
                  bias == nullptr ? nullptr : bias->data_ptr<float>(),
                  out.data_ptr<float>(), CpuProductPool::ForThisThread());
  return out;
}

}  // namespace

at::Tensor CpuMm(const at::Tensor& x, const at::Tensor& w,
                 const CpuPanels* panels) {
  if (PanelsTake(x, panels)) return PanelProduct(nullptr, x, *panels);
  auto one = [&](at::Tensor out, int64_t j, int64_t b) {
    at::mm_out(out, x, w.narrow(1, j, b));
  };
  if (CpuProductPool* pool = PoolFor(x, w)) {
    return ByColumnRanges(pool, x, w, one);
  }
  const int64_t block = SplitBlock(x, w);
  if (block == 0) return at::mm(x, w);
  return ByColumnBlocks(x, w, block, one);
}

at::Tensor CpuAddmm(const at::Tensor& bias, const at::Tensor& x,
                    const at::Tensor& w, const CpuPanels* panels) {
  const bool full_bias = bias.sizes().equals({x.size(0), w.size(1)});
  if (full_bias && CpuKernelsApply(bias) && PanelsTake(x, panels)) {
    return PanelProduct(&bias, x, *panels);
  }
  auto one = [&](at::Tensor out, int64_t j, int64_t b) {
    at::addmm_out(out, bias.narrow(1, j, b), x, w.narrow(1, j, b));
  };
  if (CpuProductPool* pool = full_bias ? PoolFor(x, w) : nullptr) {
    return ByColumnRanges(pool, x, w, one);
  }
  const int64_t block = SplitBlock(x, w);
  if (block == 0 || !full_bias) return at::addmm(bias, x, w);
  return ByColumnBlocks(x, w, block, one);
}

}  // namespace dedit
