// The fused CPU kernels (common/model/cpu/cpu_kernels.h) against the ATen
// composition they replace at inference, which the trainer still runs with
// autograd.
#include "common/model/cpu/cpu_kernels.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <atomic>
#include <chrono>
#include <initializer_list>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/model/cpu/cpu_product_pool.h"
#include "common/model/tiny_model.h"
#include "common/model/transformer_ops.h"
#include "gtest/gtest.h"

namespace dedit {
namespace {

constexpr double kEps = 1e-6;

// Max |a - b| relative to max |b|.
double RelativeError(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() /
         std::max(b.abs().max().item<double>(), 1e-12);
}

DecoderLayerWeights RandomLayer(const Qwen3Config& c) {
  DecoderLayerWeights w;
  const int64_t h = c.hidden_size, hd = c.head_dim;
  w.input_layernorm = at::rand({h}) + 0.5;
  w.post_attention_layernorm = at::rand({h}) + 0.5;
  w.q_proj = at::randn({c.num_attention_heads * hd, h}) * 0.1;
  w.k_proj = at::randn({c.num_key_value_heads * hd, h}) * 0.1;
  w.v_proj = at::randn({c.num_key_value_heads * hd, h}) * 0.1;
  w.o_proj = at::randn({h, c.num_attention_heads * hd}) * 0.1;
  w.q_norm = at::rand({hd}) + 0.5;
  w.k_norm = at::rand({hd}) + 0.5;
  w.gate_proj = at::randn({c.intermediate_size, h}) * 0.1;
  w.up_proj = at::randn({c.intermediate_size, h}) * 0.1;
  w.down_proj = at::randn({h, c.intermediate_size}) * 0.1;
  PackDecoderLayer(c, &w);
  return w;
}

TEST(CpuKernels, ApplyOnlyToContiguousFp32CpuTensorsWithoutGrad) {
  const at::Tensor x = at::randn({3, 8});
  {
    at::NoGradGuard no_grad;
    EXPECT_TRUE(CpuKernelsApply(x));
    EXPECT_FALSE(CpuKernelsApply(x.t()));  // not contiguous
    EXPECT_FALSE(CpuKernelsApply(x.to(at::kBFloat16)));
    EXPECT_FALSE(CpuKernelsApply(at::Tensor()));
  }
  {
    c10::InferenceMode inference;
    EXPECT_TRUE(CpuKernelsApply(x));
  }
  // Grad mode on (the trainer): the composition, which has a backward.
  EXPECT_FALSE(CpuKernelsApply(x));
}

TEST(CpuKernels, RmsNormalizeMatchesTheComposition) {
  for (int64_t rows : {1, 7, 300}) {
    at::Tensor x = at::randn({rows, 128}) * 3;
    at::Tensor reference = x * at::rsqrt(x.pow(2).mean({-1}, true) + kEps);
    c10::InferenceMode inference;
    at::Tensor fused = CpuRmsNormalize(x, kEps);
    EXPECT_LT(RelativeError(fused, reference), 1e-6) << rows << " rows";
    // RmsNormalize itself takes the kernel at inference.
    EXPECT_LT(RelativeError(RmsNormalize(x, kEps), reference), 1e-6);
  }
}

TEST(CpuKernels, HeadNormRopeMatchesNormThenRotary) {
  const int64_t heads = 6, hd = 32, extra = 2 * hd;  // v columns, skipped
  const Rotary rotary(hd, 10000.0, at::kCPU);
  for (int64_t n : {1, 16, 257}) {
    at::Tensor qkv = at::randn({n, heads * hd + extra});
    at::Tensor weight = at::rand({heads, hd}) + 0.5;
    at::Tensor positions = at::arange(40, 40 + n, at::kLong);
    at::Tensor cos, sin;
    rotary.HeadTables(positions, at::kFloat, &cos, &sin);
    // Grad mode on: RmsNorm and ApplyPacked are the ATen composition.
    at::Tensor reference = rotary.ApplyPacked(
        RmsNorm(qkv.narrow(1, 0, heads * hd).view({n, heads, hd}), weight,
                kEps),
        cos, sin);
    c10::InferenceMode inference;
    at::Tensor fused = CpuHeadNormRope(qkv, heads, hd, weight, kEps, cos, sin);
    ASSERT_EQ(fused.sizes(), reference.sizes());
    EXPECT_LT(RelativeError(fused, reference), 1e-5) << n << " tokens";
  }
}

TEST(CpuKernels, SiluMulMatchesTheComposition) {
  for (int64_t n : {1, 9, 130}) {
    at::Tensor gu = at::randn({n, 2 * 48}) * 4;
    at::Tensor reference = at::silu(gu.narrow(1, 0, 48)) * gu.narrow(1, 48, 48);
    c10::InferenceMode inference;
    EXPECT_LT(RelativeError(CpuSiluMul(gu), reference), 1e-6) << n;
  }
}

TEST(CpuKernels, ColumnBlocksOnlyForFewRowsOfALargeProduct) {
  // Small products, and many rows, run as one product.
  EXPECT_EQ(CpuMmColumnBlock(1, 128, 2048), 2048);
  EXPECT_EQ(CpuMmColumnBlock(10, 128, 768), 768);
  EXPECT_EQ(CpuMmColumnBlock(64, 128, 768), 768);
  // Few rows of a large one: blocks of whole 16-column groups, each within
  // the small-kernel limit.
  for (int64_t m : {4, 12, 16, 32}) {
    const int64_t b = CpuMmColumnBlock(m, 128, 2048);
    EXPECT_LT(b, 2048) << m;
    EXPECT_EQ(b % 16, 0) << m;
    EXPECT_LE(m * 128 * b, 1000000) << m;
  }
  EXPECT_EQ(CpuMmColumnBlock(16, 128, 768), 480);
}

// CpuMm and CpuAddmm (full bias) against one ATen product, for m x 128
// inputs and 128 x n weights.
void ExpectProductsMatchOneProduct(std::initializer_list<int64_t> rows,
                                   std::initializer_list<int64_t> widths) {
  for (int64_t m : rows) {
    for (int64_t n : widths) {
      const at::Tensor x = at::randn({m, 128});
      const at::Tensor w = at::randn({128, n}) * 0.1;
      const at::Tensor bias = at::randn({m, n});
      EXPECT_LT(RelativeError(CpuMm(x, w), at::mm(x, w)), 1e-6)
          << m << "x" << n;
      EXPECT_LT(RelativeError(CpuAddmm(bias, x, w), at::addmm(bias, x, w)),
                1e-6)
          << m << "x" << n;
    }
  }
}

TEST(CpuKernels, SplitProductsMatchOneProduct) {
  c10::InferenceMode inference;
  // Row counts on both sides of the split, a width that is not a multiple
  // of the block, and a narrow one that is never split.
  ExpectProductsMatchOneProduct({1, 7, 16, 31, 40}, {2048, 1000, 96});
  // Operands the kernels do not take (a transposed view, bf16) and a
  // broadcast bias fall back to one product.
  const at::Tensor x = at::randn({16, 128});
  const at::Tensor w = at::randn({2048, 128}).t();
  EXPECT_LT(RelativeError(CpuMm(x, w), at::mm(x, w)), 1e-6);
  const at::Tensor wc = w.contiguous();
  const at::Tensor row = at::randn({2048});
  EXPECT_LT(RelativeError(CpuAddmm(row, x, wc), at::addmm(row, x, wc)), 1e-6);
  EXPECT_EQ(CpuMm(x.to(at::kBFloat16), wc.to(at::kBFloat16)).scalar_type(),
            at::kBFloat16);
}

// With --product_threads 2 the few-row products are split across the
// model thread's helper: the same products, by column ranges (and one row,
// 40 rows or 16 columns as one product).
TEST(CpuKernels, ProductsSplitAcrossThreadsMatchOneProduct) {
  c10::InferenceMode inference;
  SetCpuProductThreads(2);
  CpuProductPool* pool = CpuProductPool::ForThisThread();
  ASSERT_NE(pool, nullptr);
  const int64_t runs = pool->runs();
  ExpectProductsMatchOneProduct({1, 2, 7, 16, 32, 40}, {2048, 1000, 96, 16});
  EXPECT_GT(pool->runs(), runs);
  SetCpuProductThreads(1);
  EXPECT_EQ(CpuProductPool::ForThisThread(), nullptr);
}

// Every part runs exactly once, whether the helpers are polling or asleep
// (a pause past their poll), over many calls; a part's exception reaches
// the caller and the pool keeps working.
TEST(CpuProductPoolTest, RunsEveryPartOnceAndRethrows) {
  CpuProductPool pool(/*helpers=*/2);
  EXPECT_EQ(pool.threads(), 3);
  for (int call = 0; call < 400; ++call) {
    const int parts = 1 + call % 7;
    std::vector<std::atomic<int>> runs(parts);
    pool.Run(parts, [&](int part) { runs[part].fetch_add(1); });
    for (int p = 0; p < parts; ++p) {
      ASSERT_EQ(runs[p].load(), 1) << "call " << call << " part " << p;
    }
    if (call % 50 == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  EXPECT_THROW(pool.Run(4,
                        [](int part) {
                          if (part == 2) throw std::runtime_error("part 2");
                        }),
               std::runtime_error);
  std::atomic<int> after{0};
  pool.Run(3, [&](int) { after.fetch_add(1); });
  EXPECT_EQ(after.load(), 3);
}

TEST(CpuKernels, DecoderLayerAtInferenceMatchesTheTrainersComposition) {
  const Qwen3Config c = DefaultTinySpec().target;  // the engine tests' shape
  const DecoderLayerWeights w = RandomLayer(c);
  const Rotary rotary(c.head_dim, 10000.0, at::kCPU);
  at::Tensor x = at::randn({5, c.hidden_size});
  at::Tensor attn = at::randn({5, c.num_attention_heads * c.head_dim});
  at::Tensor cos, sin;
  rotary.HeadTables(at::arange(3, 8, at::kLong), at::kFloat, &cos, &sin);
  const QkvProjection ref = ProjectQkv(x, w, c, rotary, cos, sin);
  const at::Tensor ref_out = FinishDecoderLayer(x, attn, w, c);
  c10::InferenceMode inference;
  const QkvProjection got = ProjectQkv(x, w, c, rotary, cos, sin);
  EXPECT_LT(RelativeError(got.q, ref.q), 1e-5);
  EXPECT_LT(RelativeError(got.k, ref.k), 1e-5);
  EXPECT_LT(RelativeError(got.v, ref.v), 1e-6);
  EXPECT_LT(RelativeError(FinishDecoderLayer(x, attn, w, c), ref_out), 1e-5);
}

TEST(CpuKernels, BadHeadDimIsAnError) {
  c10::InferenceMode inference;
  at::Tensor qkv = at::randn({2, 3 * 7});
  at::Tensor weight = at::ones({3, 7});
  at::Tensor table = at::ones({2, 7});
  EXPECT_THROW(CpuHeadNormRope(qkv, 3, 7, weight, kEps, table, table),
               c10::Error);
}

// The inference models' RoPE tables come from a cache made once at load;
// its rows must be what Tables computes for the same positions, to the bit
// (a forward's positions are any subset, and a verify row must equal the
// decode step of its token). Positions past the cache are computed.
TEST(RotaryCache, HeadTablesEqualComputedTablesToTheBit) {
  at::NoGradGuard no_grad;
  for (auto [hd, theta] : {std::pair<int, double>{32, 1e4}, {128, 1e6}}) {
    const Rotary computed(hd, theta, at::kCPU);
    Rotary cached(hd, theta, at::kCPU);
    cached.CacheTables(1024, at::kFloat);
    const std::vector<std::vector<int64_t>> sets = {
        {0},
        {5},
        {1023},
        {7, 8, 9, 10, 11, 12, 13, 14, 15},
        {1000, 3, 517, 2, 2},
        {1024, 3},
        {40000}};
    for (const std::vector<int64_t>& positions : sets) {
      const at::Tensor p = at::tensor(positions, at::kLong);
      at::Tensor cos, sin, want_cos, want_sin;
      cached.HeadTables(p, at::kFloat, &cos, &sin);
      computed.HeadTables(p, at::kFloat, &want_cos, &want_sin);
      ASSERT_EQ(cos.sizes(), want_cos.sizes());
      EXPECT_TRUE(at::equal(cos, want_cos)) << "hd " << hd;
      EXPECT_TRUE(at::equal(sin, want_sin)) << "hd " << hd;
    }
    // Every cached row against a one-position computation.
    for (int64_t pos = 0; pos < 1024; pos += 37) {
      at::Tensor cos, sin, want_cos, want_sin;
      cached.HeadTables(at::tensor({pos}, at::kLong), at::kFloat, &cos, &sin);
      computed.Tables(at::tensor({pos}, at::kLong), at::kFloat, &want_cos,
                      &want_sin);
      EXPECT_TRUE(at::equal(cos.squeeze(1), want_cos)) << "position " << pos;
      EXPECT_TRUE(at::equal(sin.squeeze(1), want_sin)) << "position " << pos;
    }
  }
}

}  // namespace
}  // namespace dedit
