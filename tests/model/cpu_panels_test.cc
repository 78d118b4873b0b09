// Weight panels (common/model/cpu/cpu_panels.h): the f32 and bf16 products
// on each ISA this CPU runs (AVX2, AVX-512) against at::mm, rows summed
// alike whatever the product's rows and threads, the ISA choice and its
// test cap, the --cpu_products flag, and whole models on panels.
#include "common/model/cpu/cpu_panels.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/model/cpu/cpu_kernels.h"
#include "common/model/cpu/cpu_product_pool.h"
#include "common/model/kv_pool.h"
#include "common/model/packed_attention.h"
#include "common/model/transformer_ops.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"

namespace dedit {
namespace {

// Max |a - b| relative to max |b|.
double RelativeError(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() /
         std::max(b.abs().max().item<double>(), 1e-12);
}

// x rounded to bf16 (nearest even) and back.
at::Tensor RoundedToBf16(const at::Tensor& x) {
  return x.to(at::kBFloat16).to(at::kFloat);
}

using testing::CpuIsasRunning;
using testing::ScopedCpuIsaCap;

// A kind's kernels on one ISA: the test runs under that ISA's cap, and is
// skipped where this CPU does not run the kind on it (AVX-512 on an
// AVX2-only CPU; kBf16 on AVX-512 without AVX512_BF16 runs AVX2).
class CpuPanelsTest
    : public ::testing::TestWithParam<std::tuple<CpuProducts, CpuIsa>> {
 protected:
  CpuProducts kind() const { return std::get<0>(GetParam()); }
  CpuIsa isa() const { return std::get<1>(GetParam()); }
  void SetUp() override {
    SetCpuIsaCapForTesting(isa());
    if (CpuIsaOf(kind()) != isa()) {
      GTEST_SKIP() << "this CPU does not run " << CpuProductsName(kind())
                   << " panels on " << CpuIsaName(isa());
    }
  }
  void TearDown() override { SetCpuIsaCapForTesting(CpuIsa::kAvx512); }
  // What the panels should compute: f32 operands as given, or both rounded
  // to bf16 with f32 sums.
  at::Tensor Expected(const at::Tensor& x, const at::Tensor& w) const {
    if (kind() == CpuProducts::kF32) return at::mm(x, w);
    return at::mm(RoundedToBf16(x).to(at::kDouble),
                  RoundedToBf16(w).to(at::kDouble))
        .to(at::kFloat);
  }
  at::NoGradGuard no_grad_;
};

// Every shape class the tiles meet: rows of a whole tile (6) and each
// remainder, column counts off the 16-column groups and the 4-group tiles,
// odd k (a bf16 pair with a zero), k past one 32-element conversion step.
TEST_P(CpuPanelsTest, ProductsMatchAtMmForEveryShape) {
  at::manual_seed(3);
  for (int64_t k : {1, 3, 17, 32, 33, 128, 384}) {
    for (int64_t n : {1, 15, 16, 17, 64, 65, 200}) {
      const at::Tensor w = at::randn({k, n});
      const auto panels = CpuPanels::Pack(w, kind());
      ASSERT_NE(panels, nullptr);
      EXPECT_EQ(panels->k(), k);
      EXPECT_EQ(panels->n(), n);
      for (int64_t m : {1, 2, 5, 6, 7, 13, 33}) {
        const at::Tensor x = at::randn({m, k});
        const at::Tensor bias = at::randn({m, n});
        const std::string at_shape = absl::StrCat(m, "x", k, " by ", k, "x", n);
        const at::Tensor got = CpuMm(x, w, panels.get());
        EXPECT_LT(RelativeError(got, Expected(x, w)), 1e-5) << at_shape;
        const at::Tensor got_bias = CpuAddmm(bias, x, w, panels.get());
        EXPECT_LT(RelativeError(got_bias, bias + Expected(x, w)), 1e-5)
            << at_shape;
        if (kind() == CpuProducts::kBf16) {
          // And near the f32 product, as bf16 rounding allows.
          EXPECT_LT(RelativeError(got, at::mm(x, w)), 3e-2) << at_shape;
        }
      }
    }
  }
}

// A verify row must be the decode step of the same token to the bit: each
// output row is summed in one order whatever the rows around it, and
// whichever thread takes its columns.
TEST_P(CpuPanelsTest, EachRowIsTheSameWhateverTheRowsAndThreads) {
  at::manual_seed(5);
  const at::Tensor w = at::randn({128, 768}) * 0.1;
  const auto panels = CpuPanels::Pack(w, kind());
  ASSERT_NE(panels, nullptr);
  const at::Tensor x = at::randn({16, 128});
  const at::Tensor all = CpuMm(x, w, panels.get());
  for (int64_t r = 0; r < x.size(0); ++r) {
    EXPECT_TRUE(testing::BitEqual(
        CpuMm(x.narrow(0, r, 1).contiguous(), w, panels.get()),
        all.narrow(0, r, 1)))
        << "row " << r;
  }
  EXPECT_TRUE(
      testing::BitEqual(CpuMm(x.narrow(0, 3, 9).contiguous(), w, panels.get()),
                        all.narrow(0, 3, 9)));
  SetCpuProductThreads(2);
  absl::Cleanup off = [] { SetCpuProductThreads(1); };
  const int64_t runs = CpuProductPool::ForThisThread()->runs();
  EXPECT_TRUE(testing::BitEqual(CpuMm(x, w, panels.get()), all));
  EXPECT_GT(CpuProductPool::ForThisThread()->runs(), runs);  // split ran
}

// A decode step over a weight past a core's L2 (a DRAM-resident model)
// splits its one row across the pool's threads, so it reads the weight on
// every core; a small weight's one row stays on the calling thread. Either
// way the row is the same to the bit as alone on one thread and as a row of
// a verify block (17 rows: whole 6-row tiles and a remainder, each weight
// tile read once for all of them).
TEST_P(CpuPanelsTest, OneRowOverALargeWeightSplitsAndSumsTheSame) {
  at::manual_seed(6);
  const at::Tensor big = at::randn({1024, 1040}) * 0.05;  // 1.06 M weights
  const at::Tensor small = at::randn({128, 768}) * 0.1;
  const at::Tensor x = at::randn({17, 1024});
  for (const at::Tensor* w : {&big, &small}) {
    const auto panels = CpuPanels::Pack(*w, kind());
    ASSERT_NE(panels, nullptr);
    const at::Tensor xw = x.narrow(1, 0, w->size(0)).contiguous();
    const at::Tensor alone = CpuMm(xw.narrow(0, 4, 1).contiguous(), *w,
                                   panels.get());  // one thread
    SetCpuProductThreads(2);
    absl::Cleanup off = [] { SetCpuProductThreads(1); };
    CpuProductPool* pool = CpuProductPool::ForThisThread();
    const int64_t runs = pool->runs();
    const at::Tensor split =
        CpuMm(xw.narrow(0, 4, 1).contiguous(), *w, panels.get());
    EXPECT_EQ(pool->runs(), runs + (w == &big ? 1 : 0))
        << "k " << w->size(0) << ": one row split only past L2";
    EXPECT_TRUE(testing::BitEqual(split, alone));
    const at::Tensor block = CpuMm(xw, *w, panels.get());
    EXPECT_TRUE(testing::BitEqual(block.narrow(0, 4, 1), alone));
    EXPECT_LT(RelativeError(block, Expected(xw, *w)), 1e-5);
  }
}

// Operands the kernels do not take go to ATen, panels or not: a transposed
// (strided) x, a k that is not the panels', grad mode.
TEST_P(CpuPanelsTest, OtherOperandsFallBackToAten) {
  const at::Tensor w = at::randn({8, 24});
  const auto panels = CpuPanels::Pack(w, kind());
  ASSERT_NE(panels, nullptr);
  const int64_t before = CpuPanels::products_run();
  const at::Tensor xt = at::randn({8, 3}).t();  // [3, 8], not contiguous
  EXPECT_LT(RelativeError(CpuMm(xt, w, panels.get()), at::mm(xt, w)), 1e-6);
  EXPECT_EQ(CpuPanels::products_run(), before);
  EXPECT_EQ(CpuPanels::Pack(w.t(), kind()), nullptr);  // not contiguous
  EXPECT_EQ(CpuPanels::Pack(w.to(at::kBFloat16), kind()), nullptr);
  EXPECT_EQ(CpuPanels::Pack(w, CpuProducts::kBlas), nullptr);
  const at::Tensor x = at::randn({3, 8});
  EXPECT_EQ(CpuMm(x, w, panels.get()).size(1), 24);
  EXPECT_EQ(CpuPanels::products_run(), before + 1);
}

// A whole model loaded on panels: its logits stay near the ATen path's, and
// speculation over it is lossless (verify blocks and drafter blocks on
// panels against one-row greedy decoding on panels).
TEST_P(CpuPanelsTest, ModelsOnPanelsKeepTheirLogitsAndStayLossless) {
  const TinyModelSpec spec = DefaultTinySpec();
  const auto reference_pair = testing::MakeTinyPair(spec, 41);
  SetCpuProducts(kind());
  absl::Cleanup blas = [] { SetCpuProducts(CpuProducts::kBlas); };
  const auto pair = testing::MakeTinyPair(spec, 41);  // same weights, panels
  const std::vector<int32_t> prompt = testing::RandomPrompt(23, 128, 9);
  const int64_t before = CpuPanels::products_run();
  const std::vector<int32_t> greedy =
      testing::GreedyReference(*pair->target, prompt, 24);
  EXPECT_GT(CpuPanels::products_run(), before);
  // The two decode the same text: random weights rarely have near ties,
  // and a bf16 argmax that flipped would show here first.
  const std::vector<int32_t> greedy_blas =
      testing::GreedyReference(*reference_pair->target, prompt, 24);
  size_t same = 0;
  while (same < greedy.size() && greedy[same] == greedy_blas[same]) ++same;
  EXPECT_GE(same, kind() == CpuProducts::kF32 ? greedy.size() : 8u);

  testing::ExpectLosslessSpeculation(*pair, prompt, greedy);
}

// The whole forward, not only its products, computes a row the same way
// whatever the rows around it: a verify block's logits equal, to the bit,
// the decode steps of the same tokens. With bf16 activations this is what
// keeps speculation lossless: a last-bit difference anywhere before a
// product (attention, an activation) can move a bf16 rounding by 2^-8 and
// flip a near tie.
TEST_P(CpuPanelsTest, VerifyRowsEqualDecodeStepsToTheBit) {
  SetCpuProducts(kind());
  absl::Cleanup blas = [] { SetCpuProducts(CpuProducts::kBlas); };
  const auto pair = testing::MakeTinyPair(DefaultTinySpec(), 43);
  testing::ExpectVerifyRowsEqualDecodeSteps(*pair->target);
}

// CpuDecoderLayer runs a whole layer on raw rows; it must compute what
// the op-by-op layer (ProjectQkv, PackedAttention, FinishDecoderLayer)
// computes on the same kernels, to the bit: its output and the K/V it
// writes, for prefill chunks, a verify block and decode rows in one
// forward, then a forward over the cached keys.
TEST_P(CpuPanelsTest, FusedLayerEqualsTheOpByOpLayerToTheBit) {
  SetCpuProducts(kind());
  absl::Cleanup blas = [] { SetCpuProducts(CpuProducts::kBlas); };
  Qwen3Config c;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000;
  at::manual_seed(5);
  const int64_t h = c.hidden_size, hd = c.head_dim;
  DecoderLayerWeights w;
  w.input_layernorm = 1 + 0.1 * at::randn({h});
  w.post_attention_layernorm = 1 + 0.1 * at::randn({h});
  w.q_proj = 0.1 * at::randn({c.num_attention_heads * hd, h});
  w.k_proj = 0.1 * at::randn({c.num_key_value_heads * hd, h});
  w.v_proj = 0.1 * at::randn({c.num_key_value_heads * hd, h});
  w.o_proj = 0.1 * at::randn({h, c.num_attention_heads * hd});
  w.q_norm = 1 + 0.1 * at::randn({hd});
  w.k_norm = 1 + 0.1 * at::randn({hd});
  w.gate_proj = 0.1 * at::randn({c.intermediate_size, h});
  w.up_proj = 0.1 * at::randn({c.intermediate_size, h});
  w.down_proj = 0.1 * at::randn({h, c.intermediate_size});
  PackDecoderLayer(c, &w);
  ASSERT_NE(w.qkv_p, nullptr);
  const Rotary rotary(static_cast<int>(hd), c.rope_theta, at::kCPU);
  KvPool::Shape shape{1, c.num_key_value_heads, static_cast<int>(hd), 256};
  KvPool op_pool(shape, at::kFloat, at::kCPU),
      fused_pool(shape, at::kFloat, at::kCPU);
  for (KvPool* pool : {&op_pool, &fused_pool}) {
    for (SequenceId id : {1, 2, 3}) ASSERT_TRUE(pool->Add(id).ok());
    pool->Reserve(64);
  }
  // Two forwards: prefills (20, 5 and 1 tokens), then a 7-token verify
  // block, a decode row and a bidirectional 4-token block (a drafter's).
  const std::vector<std::vector<AttentionSegment>> forwards = {
      {{0, 0, 20, true}, {1, 0, 5, true}, {2, 0, 1, true}},
      {{0, 20, 7, true}, {1, 5, 1, true}, {2, 1, 4, false}}};
  for (const std::vector<AttentionSegment>& segments : forwards) {
    std::vector<int64_t> positions;
    for (const AttentionSegment& s : segments) {
      for (int64_t i = 0; i < s.length; ++i) positions.push_back(s.start + i);
    }
    const int64_t n = static_cast<int64_t>(positions.size());
    const at::Tensor x = at::randn({n, h});
    at::Tensor cos, sin;
    rotary.HeadTables(at::tensor(positions, at::kLong), at::kFloat, &cos, &sin);
    const PackedAttention op_attention(segments, op_pool,
                                       c.num_attention_heads);
    const PackedAttention fused_attention(segments, fused_pool,
                                          c.num_attention_heads);
    ASSERT_TRUE(CpuDecoderLayerApplies(x, w, c, cos, sin, fused_attention));
    auto [q, k, v] = ProjectQkv(x, w, c, rotary, cos, sin);
    op_attention.WriteKv(&op_pool, 0, k, v);
    const at::Tensor expected =
        FinishDecoderLayer(x, op_attention.Run(q, op_pool, 0), w, c);
    const at::Tensor got =
        CpuDecoderLayer(x, w, c, cos, sin, fused_attention, &fused_pool, 0);
    EXPECT_TRUE(testing::BitEqual(got, expected))
        << "max diff " << (got - expected).abs().max().item<float>();
    EXPECT_TRUE(testing::BitEqual(fused_pool.keys(0), op_pool.keys(0)));
    EXPECT_TRUE(testing::BitEqual(fused_pool.values(0), op_pool.values(0)));
  }
  // A layer off the panels' path is not taken.
  DecoderLayerWeights blas_weights = w;
  blas_weights.o_p = nullptr;
  const PackedAttention attention(forwards[0], fused_pool,
                                  c.num_attention_heads);
  at::Tensor cos, sin;
  rotary.HeadTables(at::arange(26, at::kLong), at::kFloat, &cos, &sin);
  EXPECT_FALSE(CpuDecoderLayerApplies(at::randn({26, h}), blas_weights, c, cos,
                                      sin, attention));
}

// Shapes off every boundary of both ISAs' tiles: k and n not multiples of
// 16 (partial groups, half-filled ymm pairs, an odd k's zero pair), and
// every row count from 1 to 17 (each remainder of the 4- and 6-row tiles,
// whole tiles and a remainder), against at::mm on the same operands
// (bf16-rounded for bf16 panels) within float rounding.
TEST_P(CpuPanelsTest, OddShapesMatchAtMmOnTheSameOperands) {
  at::manual_seed(11);
  for (int64_t k : {5, 31, 47, 100}) {
    for (int64_t n : {3, 23, 41, 100}) {
      const at::Tensor w = at::randn({k, n});
      const auto panels = CpuPanels::Pack(w, kind());
      ASSERT_NE(panels, nullptr);
      for (int64_t m = 1; m <= 17; ++m) {
        const at::Tensor x = at::randn({m, k});
        const at::Tensor bias = at::randn({m, n});
        const std::string at_shape = absl::StrCat(m, "x", k, " by ", k, "x", n);
        EXPECT_LT(RelativeError(CpuMm(x, w, panels.get()), Expected(x, w)),
                  1e-5)
            << at_shape;
        EXPECT_LT(RelativeError(CpuAddmm(bias, x, w, panels.get()),
                                bias + Expected(x, w)),
                  1e-5)
            << at_shape;
      }
    }
  }
}

// The invariant of cpu_panels.h on an odd shape: each row of a 17-row
// product (whole tiles and a remainder on either ISA), with and without a
// bias, equals to the bit that row computed alone, and the same product on
// a pool of two threads (each taking other columns).
TEST_P(CpuPanelsTest, RowsOfASeventeenRowProductEqualEachRowAlone) {
  at::manual_seed(12);
  const at::Tensor w = at::randn({101, 203}) * 0.1;
  const auto panels = CpuPanels::Pack(w, kind());
  ASSERT_NE(panels, nullptr);
  const at::Tensor x = at::randn({17, 101});
  const at::Tensor bias = at::randn({17, 203});
  const at::Tensor all = CpuMm(x, w, panels.get());
  const at::Tensor all_bias = CpuAddmm(bias, x, w, panels.get());
  for (int64_t r = 0; r < 17; ++r) {
    const at::Tensor row = x.narrow(0, r, 1).contiguous();
    EXPECT_TRUE(
        testing::BitEqual(CpuMm(row, w, panels.get()), all.narrow(0, r, 1)))
        << "row " << r;
    EXPECT_TRUE(testing::BitEqual(
        CpuAddmm(bias.narrow(0, r, 1).contiguous(), row, w, panels.get()),
        all_bias.narrow(0, r, 1)))
        << "row " << r << " with a bias";
  }
  SetCpuProductThreads(2);
  absl::Cleanup off = [] { SetCpuProductThreads(1); };
  const int64_t runs = CpuProductPool::ForThisThread()->runs();
  EXPECT_TRUE(testing::BitEqual(CpuMm(x, w, panels.get()), all));
  EXPECT_TRUE(testing::BitEqual(CpuAddmm(bias, x, w, panels.get()), all_bias));
  EXPECT_GT(CpuProductPool::ForThisThread()->runs(), runs);  // split ran
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, CpuPanelsTest,
    ::testing::Combine(::testing::Values(CpuProducts::kF32, CpuProducts::kBf16),
                       ::testing::Values(CpuIsa::kAvx2, CpuIsa::kAvx512)),
    [](const auto& info) {
      return std::string(CpuProductsName(std::get<0>(info.param))) + "_" +
             std::string(CpuIsaName(std::get<1>(info.param)));
    });

// kF32 and kBf16 take the widest ISA this CPU runs, within the test cap:
// AVX2+FMA is enough for both (so `auto` takes bf16 there), AVX-512 needs
// AVX512_BF16 for bf16, and the cap kNone leaves only blas.
TEST(CpuIsaTest, KindsTakeTheWidestIsaUnderTheCap) {
  EXPECT_EQ(CpuIsaOf(CpuProducts::kBlas), CpuIsa::kNone);
  EXPECT_TRUE(CpuRuns(CpuProducts::kBlas));
#if defined(__x86_64__)
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  const bool avx512_bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  if (!avx2) GTEST_SKIP() << "an x86 CPU without AVX2 and FMA";
  EXPECT_EQ(CpuIsaOf(CpuProducts::kF32),
            avx512 ? CpuIsa::kAvx512 : CpuIsa::kAvx2);
  EXPECT_EQ(CpuIsaOf(CpuProducts::kBf16),
            avx512_bf16 ? CpuIsa::kAvx512 : CpuIsa::kAvx2);
  EXPECT_EQ(BestCpuProducts(), CpuProducts::kBf16);
  {
    ScopedCpuIsaCap cap(CpuIsa::kAvx2);
    EXPECT_EQ(CpuIsaOf(CpuProducts::kF32), CpuIsa::kAvx2);
    EXPECT_EQ(CpuIsaOf(CpuProducts::kBf16), CpuIsa::kAvx2);
    EXPECT_EQ(BestCpuProducts(), CpuProducts::kBf16);
  }
  {
    ScopedCpuIsaCap cap(CpuIsa::kNone);
    EXPECT_FALSE(CpuRuns(CpuProducts::kF32));
    EXPECT_FALSE(CpuRuns(CpuProducts::kBf16));
    EXPECT_EQ(BestCpuProducts(), CpuProducts::kBlas);
    EXPECT_EQ(CpuPanels::Pack(at::randn({4, 4}), CpuProducts::kF32), nullptr);
    EXPECT_EQ(SetCpuProductsFlag("f32").code(),
              absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(CpuIsaOf(CpuProducts::kF32),
            avx512 ? CpuIsa::kAvx512 : CpuIsa::kAvx2);
#else
  GTEST_SKIP() << "not x86-64";
#endif
}

// Where both ISAs run, f32 panels agree to the bit (each output is the
// same FMA chain in k order), and so do PanelSiluMul (the same exp) and
// CpuFloatsToBf16; bf16 panels agree within float rounding (VDPBF16PS
// flushes denormals, and its order inside a pair is the hardware's).
TEST(CpuIsaTest, Avx2AndAvx512KernelsAgree) {
  if (CpuIsasRunning(CpuProducts::kF32).size() < 2) {
    GTEST_SKIP() << "needs a CPU with AVX-512 (and AVX2)";
  }
  at::manual_seed(13);
  const at::Tensor w = at::randn({67, 45});
  const at::Tensor x = at::randn({9, 67});
  const auto f32 = CpuPanels::Pack(w, CpuProducts::kF32);
  ASSERT_NE(f32, nullptr);
  at::Tensor gu = at::randn({3, 2 * 37}) * 4;
  at::Tensor silu512 = at::empty({3, 37}), silu2 = at::empty({3, 37});
  const at::Tensor wide = CpuMm(x, w, f32.get());
  PanelSiluMul(gu.data_ptr<float>(), 3, 37, silu512.data_ptr<float>());
  {
    ScopedCpuIsaCap cap(CpuIsa::kAvx2);
    EXPECT_TRUE(testing::BitEqual(CpuMm(x, w, f32.get()), wide));
    PanelSiluMul(gu.data_ptr<float>(), 3, 37, silu2.data_ptr<float>());
  }
  EXPECT_TRUE(testing::BitEqual(silu2, silu512));
  if (CpuIsasRunning(CpuProducts::kBf16).size() < 2) return;
  const auto bf16 = CpuPanels::Pack(w, CpuProducts::kBf16);
  ASSERT_NE(bf16, nullptr);
  const at::Tensor dot = CpuMm(x, w, bf16.get());
  std::vector<uint16_t> bits512(67), bits2(67);
  CpuFloatsToBf16(x.data_ptr<float>(), 67, bits512.data());
  ScopedCpuIsaCap cap(CpuIsa::kAvx2);
  EXPECT_LT(RelativeError(CpuMm(x, w, bf16.get()), dot), 1e-5);
  CpuFloatsToBf16(x.data_ptr<float>(), 67, bits2.data());
  EXPECT_EQ(bits2, bits512);
}

// f32 -> bf16 of the activations and the bf16 K/V cache on each ISA: to
// nearest even (ties both ways), denormals to a zero of their sign (as
// VCVTNE2PS2BF16), NaN kept a quiet NaN, overflow to infinity, for every
// length around the 16-element steps.
TEST(CpuFloatsToBf16, RoundsAsVcvtne2ps2bf16OnEachIsa) {
  auto expected = [](uint32_t u) -> uint16_t {
    if ((u & 0x7f800000u) == 0) return (u >> 16) & 0x8000;
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40;
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  };
  std::vector<uint32_t> special = {
      0x3f800000, 0x3f808000, 0x3f818000, 0x3f808001, 0x3f80ffff, 0x00000001,
      0x807fffff, 0x80000000, 0x7f800000, 0xff800000, 0x7f800001, 0xffc12345,
      0x7f7fffff, 0xff7fffff, 0x00800000, 0x4049ff80, 0xc049ff80};
  at::manual_seed(14);
  const at::Tensor noise =
      at::randn({40 - static_cast<int64_t>(special.size())});
  for (int64_t i = 0; i < noise.numel(); ++i) {
    uint32_t u;
    const float f = noise[i].item<float>();
    std::memcpy(&u, &f, sizeof(u));
    special.push_back(u);
  }
  const std::vector<CpuIsa> isas = CpuIsasRunning(CpuProducts::kBf16);
  if (isas.empty()) GTEST_SKIP() << "needs AVX2 and FMA";
  for (CpuIsa isa : isas) {
    ScopedCpuIsaCap cap(isa);
    for (size_t n = 1; n <= special.size(); ++n) {
      std::vector<float> x(n);
      std::memcpy(x.data(), special.data(), n * sizeof(float));
      std::vector<uint16_t> got(n + 1, 0xabcd);
      CpuFloatsToBf16(x.data(), static_cast<int64_t>(n), got.data());
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(got[i], expected(special[i]))
            << CpuIsaName(isa) << ": element " << i << " of " << n
            << ", bits 0x" << std::hex << special[i];
      }
      EXPECT_EQ(got[n], 0xabcd) << CpuIsaName(isa) << ": wrote past " << n;
    }
  }
}

// The layers' SiLU on panels: silu(gate) * up per element, near ATen's,
// over partial 16-lane tails and extreme gates (exp clamped, no NaN).
TEST(PanelSiluMul, MatchesTheComposition) {
  const std::vector<CpuIsa> isas = CpuIsasRunning(CpuProducts::kF32);
  if (isas.empty()) GTEST_SKIP() << "needs AVX2 and FMA, or AVX-512";
  for (CpuIsa isa : isas) {
    SCOPED_TRACE(CpuIsaName(isa));
    ScopedCpuIsaCap cap(isa);
    at::manual_seed(7);
    for (int64_t inter : {1, 7, 9, 15, 16, 17, 384}) {
      for (int64_t n : {1, 7}) {
        at::Tensor gu = at::randn({n, 2 * inter}) * 4;
        gu[0][0] = -100.0f;
        gu[n - 1][inter - 1] = 100.0f;
        at::Tensor out = at::empty({n, inter});
        PanelSiluMul(gu.data_ptr<float>(), n, inter, out.data_ptr<float>());
        const at::Tensor reference =
            at::silu(gu.narrow(1, 0, inter)) * gu.narrow(1, inter, inter);
        EXPECT_FALSE(out.isnan().any().item<bool>());
        EXPECT_LT(RelativeError(out, reference), 1e-6) << n << " x " << inter;
      }
    }
  }
}

// The drafter's argmax and confidence in two vector passes: the same
// argmax as at::max (the first of equal maxima), and the same confidence
// as the ATen composition up to the exp's rounding.
TEST(CpuArgmaxConfidence, MatchesAtenMaxAndSoftmax) {
  const std::vector<CpuIsa> isas = CpuIsasRunning(CpuProducts::kF32);
  if (isas.empty()) GTEST_SKIP() << "needs AVX2 and FMA, or AVX-512";
  for (CpuIsa isa : isas) {
    SCOPED_TRACE(CpuIsaName(isa));
    ScopedCpuIsaCap cap(isa);
    at::manual_seed(3);
    for (int64_t vocab : {1, 7, 9, 15, 16, 17, 2048, 2053}) {
      at::Tensor logits = 3 * at::randn({5, vocab});
      if (vocab > 20) {
        // Row 1: a tie between two lanes of different blocks; row 2: a tie
        // within a lane, 16 apart; row 3: all equal.
        logits[1][3] = 50;
        logits[1][vocab - 2] = 50;
        logits[2][7] = 60;
        logits[2][23] = 60;
        logits[3].fill_(0.5);
      }
      std::vector<int64_t> argmax(5);
      std::vector<float> conf(5);
      CpuArgmaxConfidence(logits.data_ptr<float>(), 5, vocab, argmax.data(),
                          conf.data());
      auto [max_logit, expected] = logits.max(-1);
      const at::Tensor expected_conf =
          at::exp(logits - max_logit.unsqueeze(1)).sum(-1).reciprocal();
      for (int64_t r = 0; r < 5; ++r) {
        EXPECT_EQ(argmax[r], expected[r].item<int64_t>())
            << "vocab " << vocab << " row " << r;
        EXPECT_NEAR(conf[r], expected_conf[r].item<float>(),
                    2e-6 * expected_conf[r].item<float>())
            << "vocab " << vocab << " row " << r;
      }
      if (vocab > 20) {
        EXPECT_EQ(argmax[1], 3);
        EXPECT_EQ(argmax[2], 7);
        EXPECT_EQ(argmax[3], 0);
        EXPECT_NEAR(conf[3], 1.0f / vocab, 1e-6);
      }
    }
  }
}

TEST(CpuProductsFlag, NamesTheFlagAndTheKernels) {
  absl::Cleanup blas = [] { SetCpuProducts(CpuProducts::kBlas); };
  const absl::Status bad = SetCpuProductsFlag("fp16");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("--cpu_products"), std::string::npos);
  EXPECT_NE(bad.message().find("fp16"), std::string::npos);
  EXPECT_EQ(GetCpuProducts(), CpuProducts::kBlas);
  // A tool that takes the kernel under another flag gets that name.
  const absl::Status other = SetCpuProductsFlag("fp16", "--check_products");
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.message().find("--check_products"), std::string::npos);
  EXPECT_EQ(other.message().find("--cpu_products"), std::string::npos);
  ASSERT_TRUE(SetCpuProductsFlag("auto").ok());  // the binaries' default
  EXPECT_EQ(GetCpuProducts(), BestCpuProducts());
  EXPECT_TRUE(CpuRuns(GetCpuProducts()));
  ASSERT_TRUE(SetCpuProductsFlag("blas").ok());
  EXPECT_EQ(GetCpuProducts(), CpuProducts::kBlas);
  for (CpuProducts kind : {CpuProducts::kF32, CpuProducts::kBf16}) {
    const absl::Status s = SetCpuProductsFlag(CpuProductsName(kind));
    if (CpuRuns(kind)) {
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_EQ(GetCpuProducts(), kind);
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    }
  }
}

}  // namespace
}  // namespace dedit
