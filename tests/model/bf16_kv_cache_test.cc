// The bf16 K/V cache (--kv_cache_dtype bf16, common/model/kv_pool.h) and the
// CPU row kernel that reads it (CpuAttentionBf16,
// common/model/cpu/cpu_attention.h): the flag and its refusals, the pool's
// rounding, attention against the per-sequence reference, grouped heads to the
// bit, and whole models whose verify rows equal their decode steps to the bit
// and whose speculation stays lossless.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "common/model/cpu/cpu_attention.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/cpu/cpu_product_pool.h"
#include "common/model/kv_pool.h"
#include "common/model/packed_attention.h"
#include "common/model/qwen3_model.h"
#include "common/model/tiny_model.h"
#include "common/model/transformer_ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"

namespace dedit {
namespace {

using ::testing::HasSubstr;

// Keys as rows of positions [..., slab, hd] -> the bf16 kernel's blocks
// (Bf16KeyOffset).
at::Tensor ToKeyBlocks(const at::Tensor& rows) {
  const int64_t s = rows.size(0), kv = rows.size(1), slab = rows.size(2),
                hd = rows.size(3);
  return rows.view({s, kv, slab / kBf16KeyBlock, kBf16KeyBlock, hd / 2, 2})
      .permute({0, 1, 2, 4, 3, 5})
      .contiguous()
      .view({s, kv, slab, hd});
}

// Sets the process's products, K/V dtype and ISA (the parameter: each
// test runs on the AVX2 kernels and, where this CPU has AVX512_BF16, on the
// AVX-512 ones) for one test, and back.
class Bf16KvCacheTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    SetCpuIsaCapForTesting(GetParam());
    if (CpuIsaOf(CpuProducts::kBf16) != GetParam() ||
        !CpuAttentionBf16Runs(32)) {
      GTEST_SKIP() << "this CPU does not run the bf16 kernels on "
                   << CpuIsaName(GetParam());
    }
    SetCpuProducts(CpuProducts::kBf16);
    SetKvCacheDtype(KvCacheDtype::kBf16);
  }
  void TearDown() override {
    SetCpuIsaCapForTesting(CpuIsa::kAvx512);
    SetCpuProducts(CpuProducts::kBlas);
    SetKvCacheDtype(KvCacheDtype::kAuto);
  }
  at::NoGradGuard no_grad_;
};

TEST(KvCacheDtypeFlag, NamesTheFlagAndWhatIsMissing) {
  absl::Cleanup reset = [] {
    SetKvCacheDtype(KvCacheDtype::kAuto);
    SetCpuProducts(CpuProducts::kBlas);
  };
  const absl::Status bad = SetKvCacheDtypeFlag("fp8");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("--kv_cache_dtype"));
  EXPECT_THAT(std::string(bad.message()), HasSubstr("fp8"));
  EXPECT_EQ(GetKvCacheDtype(), KvCacheDtype::kAuto);

  // auto: the model's dtype on the ATen (blas) path and on a GPU.
  ASSERT_TRUE(SetKvCacheDtypeFlag("auto").ok());
  SetCpuProducts(CpuProducts::kBlas);
  EXPECT_EQ(*KvPoolDtype(at::kFloat, at::kCPU, 32), at::kFloat);
  EXPECT_EQ(*KvPoolDtype(at::kBFloat16, at::kCPU, 48), at::kBFloat16);
  EXPECT_EQ(*KvPoolDtype(at::kFloat, c10::Device(at::kCUDA, 0), 32),
            at::kFloat);
  if (CpuAttentionBf16Runs(32)) {
    // Under bf16 products: bf16 where the kernel takes the head size, the
    // model's dtype (no error) where it does not; f32 products keep f32.
    SetCpuProducts(CpuProducts::kBf16);
    EXPECT_EQ(*KvPoolDtype(at::kFloat, at::kCPU, 32), at::kBFloat16);
    EXPECT_EQ(*KvPoolDtype(at::kFloat, at::kCPU, 48), at::kFloat);
    SetCpuProducts(CpuProducts::kF32);
    EXPECT_EQ(*KvPoolDtype(at::kFloat, at::kCPU, 32), at::kFloat);
    // model: the model's dtype whatever the kernels.
    SetCpuProducts(CpuProducts::kBf16);
    ASSERT_TRUE(SetKvCacheDtypeFlag("model").ok());
    EXPECT_EQ(GetKvCacheDtype(), KvCacheDtype::kModel);
    EXPECT_EQ(*KvPoolDtype(at::kFloat, at::kCPU, 32), at::kFloat);
  }

  ASSERT_TRUE(SetKvCacheDtypeFlag("bf16").ok());
  EXPECT_EQ(GetKvCacheDtype(), KvCacheDtype::kBf16);
  // The ATen (blas) path does not read a bf16 pool of an fp32 model.
  SetCpuProducts(CpuProducts::kBlas);
  const auto blas = KvPoolDtype(at::kFloat, at::kCPU, 32);
  EXPECT_EQ(blas.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(blas.status().message()),
              HasSubstr("--kv_cache_dtype=bf16"));
  EXPECT_THAT(std::string(blas.status().message()),
              HasSubstr("--cpu_products f32 or bf16 (now blas)"));
  // A GPU pool keeps the model's dtype: bf16 needs a bf16 model.
  const auto gpu = KvPoolDtype(at::kFloat, c10::Device(at::kCUDA, 0), 32);
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*KvPoolDtype(at::kBFloat16, c10::Device(at::kCUDA, 0), 32),
            at::kBFloat16);
  if (!CpuAttentionBf16Runs(32)) return;
  SetCpuProducts(CpuProducts::kF32);
  EXPECT_EQ(*KvPoolDtype(at::kFloat, at::kCPU, 32), at::kBFloat16);
  EXPECT_EQ(*KvPoolDtype(at::kFloat, at::kCPU, 128), at::kBFloat16);
  // The kernel's pieces are 32 elements.
  const auto odd = KvPoolDtype(at::kFloat, at::kCPU, 48);
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(odd.status().message()), HasSubstr("(48)"));
}

// The row path's writes round to bf16 as ATen does (nearest even), the
// same cache as Write's conversion.
TEST_P(Bf16KvCacheTest, WriteRowsRoundsAsAten) {
  KvPool::Shape shape{2, 2, 32, 16};
  KvPool by_rows(shape, at::kBFloat16, at::kCPU, 4);
  KvPool by_index(shape, at::kBFloat16, at::kCPU, 4);
  for (SequenceId id : {1, 2}) {
    ASSERT_TRUE(by_rows.Add(id).ok());
    ASSERT_TRUE(by_index.Add(id).ok());
  }
  std::vector<int64_t> rows;
  by_rows.AppendRows(by_rows.Slot(2), 3, 5, &rows);
  by_rows.AppendRows(by_rows.Slot(1), 0, 4, &rows);
  at::Tensor packed = at::randn({9, 3 * shape.kv_heads, shape.head_dim});
  // Ties and specials: exactly halfway between two bf16 values (both
  // ways to even), the largest float, a tiny one.
  uint32_t halfway_down = 0x3f808000u, halfway_up = 0x3f818000u;
  float down, up;
  std::memcpy(&down, &halfway_down, 4);
  std::memcpy(&up, &halfway_up, 4);
  packed[0][0][0] = down;
  packed[0][0][1] = up;
  packed[0][0][2] = 3.4e38f;
  packed[0][0][3] = 1e-30f;
  const at::Tensor k = packed.narrow(1, 0, shape.kv_heads);
  const at::Tensor v = packed.narrow(1, 2 * shape.kv_heads, shape.kv_heads);
  by_rows.WriteRows(1, rows, k, v);
  by_index.Write(1, at::tensor(rows, at::kLong), k, v);
  EXPECT_TRUE(at::equal(by_rows.keys(1), by_index.keys(1)));
  EXPECT_TRUE(at::equal(by_rows.values(1), by_index.values(1)));
  EXPECT_EQ(by_rows.keys(1).scalar_type(), at::kBFloat16);
  // Half the bytes of an fp32 pool of the same shape.
  EXPECT_EQ(2 * by_rows.nbytes(),
            KvPool(shape, at::kFloat, at::kCPU, 4).nbytes());
}

// A bf16_row_kernel pool keeps its keys in 16-position blocks: appends,
// the last slot moved into a removed one's hole, a new occupant's clear
// and slab growth must keep every live position's key where KeyRows
// finds it, as a row-layout pool given the same operations does, and a
// new occupant must find its positions zeroed.
TEST_P(Bf16KvCacheTest, BlockedKeysSurviveMovesClearsAndGrowth) {
  KvPool::Shape row_shape{2, 2, 32, 200};
  KvPool::Shape blocked_shape = row_shape;
  blocked_shape.bf16_row_kernel = true;
  KvPool rows(row_shape, at::kBFloat16, at::kCPU, 2, 8, 20);
  KvPool blocked(blocked_shape, at::kBFloat16, at::kCPU, 2, 8, 20);
  EXPECT_EQ(blocked.slab_tokens(), 32);  // 20 rounded up to a block
  std::map<SequenceId, int64_t> lengths;
  auto append = [&](SequenceId id, int64_t n) {
    const int64_t start = lengths[id];
    for (KvPool* pool : {&rows, &blocked}) pool->Reserve(start + n);
    std::vector<int64_t> flat;
    rows.AppendRows(rows.Slot(id), start, n, &flat);
    std::vector<int64_t> flat_blocked;
    blocked.AppendRows(blocked.Slot(id), start, n, &flat_blocked);
    for (int l = 0; l < 2; ++l) {
      const at::Tensor k = at::randn({n, 2, 32}), v = at::randn({n, 2, 32});
      rows.WriteRows(l, flat, k, v);
      blocked.WriteRows(l, flat_blocked, k, v);
    }
    lengths[id] = start + n;
    rows.SetLength(id, start + n);
    blocked.SetLength(id, start + n);
  };
  auto check = [&](const std::string& when) {
    for (const auto& [id, len] : lengths) {
      for (int l = 0; l < 2; ++l) {
        EXPECT_TRUE(
            at::equal(blocked.KeyRows(l)[blocked.Slot(id)].narrow(1, 0, len),
                      rows.keys(l)[rows.Slot(id)].narrow(1, 0, len)))
            << when << ": sequence " << id << " layer " << l;
        EXPECT_TRUE(
            at::equal(blocked.values(l)[blocked.Slot(id)].narrow(1, 0, len),
                      rows.values(l)[rows.Slot(id)].narrow(1, 0, len)))
            << when << ": sequence " << id << " layer " << l;
      }
    }
  };
  for (SequenceId id : {1, 2, 3}) {
    ASSERT_TRUE(rows.Add(id).ok());
    ASSERT_TRUE(blocked.Add(id).ok());
  }
  append(1, 21);
  append(2, 7);
  append(3, 40);  // grows the slab: 32 -> 64
  check("after appends");
  // Sequence 3 (40 tokens, the last slot) moves into sequence 1's hole.
  ASSERT_TRUE(rows.Remove(1).ok());
  ASSERT_TRUE(blocked.Remove(1).ok());
  lengths.erase(1);
  check("after a move");
  // A new occupant of the freed last slot finds zeros where 3 was.
  ASSERT_TRUE(rows.Add(4).ok());
  ASSERT_TRUE(blocked.Add(4).ok());
  lengths[4] = 0;
  EXPECT_EQ(blocked.KeyRows(0)[blocked.Slot(4)]
                .narrow(1, 0, 64)
                .abs()
                .sum()
                .item<float>(),
            0.0f);
  append(4, 3);
  append(2, 30);   // sequence 2 crosses block boundaries
  append(3, 100);  // grows the slab again: 64 -> 256
  check("after growth");
  // Removing a sequence whose slot partly shares a block with nothing
  // else: the tail clear must not touch the moved sequence's positions.
  ASSERT_TRUE(rows.Remove(2).ok());
  ASSERT_TRUE(blocked.Remove(2).ok());
  lengths.erase(2);
  check("after a second move");
  for (int l = 0; l < 2; ++l) {
    EXPECT_TRUE(
        at::isfinite(blocked.keys(l).to(at::kFloat)).all().item<bool>());
  }
  // Parking the long sequence (a partial last block) and bringing it back
  // keeps its blocked keys; a sequence parked meanwhile lets the pool
  // shrink, and the others keep theirs through the copy.
  for (KvPool* pool : {&rows, &blocked}) {
    ASSERT_TRUE(pool->Park(3).ok());
    EXPECT_TRUE(pool->Parked(3));
  }
  ASSERT_TRUE(rows.Add(5).ok());
  ASSERT_TRUE(blocked.Add(5).ok());
  lengths[5] = 0;
  append(5, 19);
  for (KvPool* pool : {&rows, &blocked}) {
    ASSERT_TRUE(pool->MakeResident(3).ok());
    EXPECT_FALSE(pool->Parked(3));
  }
  check("after parking and back");
  for (KvPool* pool : {&rows, &blocked}) ASSERT_TRUE(pool->Park(3).ok());
  EXPECT_LT(blocked.slab_tokens(), 256);  // the longest resident is 22
  lengths.erase(3);
  check("after a shrink");
}

// PackedAttention over a bf16 pool runs the bf16 row kernel: the attention
// of the bf16-rounded query over the cached (bf16) keys and values, for
// prefill chunks, decode rows, verify blocks and bidirectional blocks in
// one batch, on head sizes of one to four 32-element pieces.
TEST_P(Bf16KvCacheTest, AttentionEqualsThePerSequenceReference) {
  for (const int64_t hd : {32, 64, 128}) {
    KvPool::Shape shape{1, 2, static_cast<int>(hd), 40,
                        /*bf16_row_kernel=*/true};
    const int heads = 6;  // group 3
    KvPool pool(shape, at::kBFloat16, at::kCPU, 2);
    struct Case {
      SequenceId id;
      int64_t cached, length;
      bool causal;
    };
    const std::vector<Case> cases = {
        {1, 0, 9, true}, {2, 17, 1, true}, {3, 5, 6, false}, {4, 12, 7, true}};
    for (const Case& c : cases) ASSERT_TRUE(pool.Add(c.id).ok());
    pool.Reserve(40);
    // The cached prefixes, written through the row path.
    std::vector<AttentionSegment> prefixes;
    int64_t cached = 0;
    for (const Case& c : cases) {
      if (c.cached == 0) continue;
      prefixes.push_back({pool.Slot(c.id), 0, c.cached, true});
      cached += c.cached;
    }
    const PackedAttention prefill(prefixes, pool, heads);
    ASSERT_TRUE(prefill.cpu_rows());
    prefill.WriteKv(&pool, 0, at::randn({cached, 2, hd}),
                    at::randn({cached, 2, hd}));
    std::vector<AttentionSegment> segs;
    int64_t n = 0;
    for (const Case& c : cases) {
      segs.push_back({pool.Slot(c.id), c.cached, c.length, c.causal});
      n += c.length;
    }
    const PackedAttention attention(segs, pool, heads);
    ASSERT_TRUE(attention.cpu_rows());
    EXPECT_EQ(attention.num_groups(), 0u);
    const at::Tensor q = at::randn({n, heads, hd}) / std::sqrt(hd);
    attention.WriteKv(&pool, 0, at::randn({n, 2, hd}), at::randn({n, 2, hd}));
    const at::Tensor out = attention.Run(q, pool, 0);
    // The reference on the kernel's operands: q rounded to bf16 (the
    // reference scales by 1/sqrt(hd) itself), the pool's values as f32.
    const at::Tensor q_rounded =
        q.to(at::kBFloat16).to(at::kFloat) * std::sqrt(hd);
    int64_t off = 0;
    for (const Case& c : cases) {
      const int slot = pool.Slot(c.id);
      const int64_t total = c.cached + c.length;
      const at::Tensor keys =
          pool.KeyRows(0)[slot].narrow(1, 0, total).to(at::kFloat);
      const at::Tensor values =
          pool.values(0)[slot].narrow(1, 0, total).to(at::kFloat);
      const at::Tensor ref =
          GroupedAttention(q_rounded.narrow(0, off, c.length), keys, values,
                           c.causal ? c.cached : -1, /*block_causal_from=*/-1);
      EXPECT_LT((out.narrow(0, off, c.length) - ref).abs().max().item<float>(),
                2e-5)
          << "head size " << hd << " sequence " << c.id;
      off += c.length;
    }
  }
}

// As for the fp32 kernel: heads that share a kv head run together, and
// each head's output equals, to the bit, the one it gets alone.
TEST_P(Bf16KvCacheTest, GroupedHeadsEqualOneHeadAtATimeToTheBit) {
  const int heads = 4, kv_heads = 2, slots = 3;
  const int64_t slab = 48;
  const std::vector<int32_t> slot = {2, 0, 1, 2, 0, 1};
  const std::vector<int64_t> visible = {1, 15, 16, 17, 33, 48};
  const int64_t n = static_cast<int64_t>(slot.size());
  for (const int64_t hd : {32, 64, 96, 128}) {
    const at::Tensor q = at::randn({n, heads * hd});
    const at::Tensor key_rows =
        at::randn({slots, kv_heads, slab, hd}).to(at::kBFloat16);
    const at::Tensor keys = ToKeyBlocks(key_rows);
    const at::Tensor values =
        at::randn({slots, kv_heads, slab, hd}).to(at::kBFloat16);
    auto bits = [](const at::Tensor& t) {
      return static_cast<const uint16_t*>(t.data_ptr());
    };
    const CpuAttentionRows rows{n, slot.data(), visible.data()};
    at::Tensor grouped = at::empty({n, heads * hd});
    CpuAttentionBf16(q.data_ptr<float>(), q.stride(0), rows, heads, kv_heads,
                     hd, bits(keys), bits(values), slab,
                     grouped.data_ptr<float>(), nullptr);
    const at::Tensor head_of =
        at::arange(heads, at::kLong).div(heads / kv_heads, "floor");
    const at::Tensor keys1 =
        ToKeyBlocks(key_rows.index_select(1, head_of).contiguous());
    const at::Tensor values1 = values.index_select(1, head_of).contiguous();
    at::Tensor alone = at::empty({n, heads * hd});
    CpuAttentionBf16(q.data_ptr<float>(), q.stride(0), rows, heads, heads, hd,
                     bits(keys1), bits(values1), slab, alone.data_ptr<float>(),
                     nullptr);
    EXPECT_TRUE(testing::BitEqual(grouped, alone)) << "head size " << hd;
    // And both are attention over the rounded query.
    for (int64_t r = 0; r < n; ++r) {
      for (int h = 0; h < heads; ++h) {
        const at::Tensor k =
            key_rows[slot[r]][h / 2].narrow(0, 0, visible[r]).to(at::kFloat);
        const at::Tensor v =
            values[slot[r]][h / 2].narrow(0, 0, visible[r]).to(at::kFloat);
        const at::Tensor qh =
            q[r].narrow(0, h * hd, hd).to(at::kBFloat16).to(at::kFloat);
        const at::Tensor ref = at::softmax(at::mv(k, qh), 0).matmul(v);
        EXPECT_LT(
            (grouped[r].narrow(0, h * hd, hd) - ref).abs().max().item<float>(),
            2e-5)
            << "row " << r << " head " << h << " head size " << hd;
      }
    }
    // Dealt to two threads: the same bits.
    SetCpuProductThreads(2);
    absl::Cleanup one = [] { SetCpuProductThreads(1); };
    at::Tensor split = at::empty({n, heads * hd});
    CpuAttentionBf16(q.data_ptr<float>(), q.stride(0), rows, heads, kv_heads,
                     hd, bits(keys), bits(values), slab,
                     split.data_ptr<float>(), CpuProductPool::ForRows(n));
    EXPECT_TRUE(testing::BitEqual(split, grouped)) << "head size " << hd;
  }
}

TinyModelSpec SpecWithHeadsOf32() {
  TinyModelSpec spec = DefaultTinySpec();
  spec.target.head_dim = 32;
  spec.drafter.layers.head_dim = 32;
  return spec;
}

// A verify block's logits equal the decode steps of the same tokens to the
// bit over a bf16 cache too (the verify block shares its forward with
// another sequence's prefill): what keeps speculation lossless.
TEST_P(Bf16KvCacheTest, VerifyRowsEqualDecodeStepsToTheBit) {
  const auto pair = testing::MakeTinyPair(SpecWithHeadsOf32(), 43);
  testing::ExpectVerifyRowsEqualDecodeSteps(*pair->target);
}

// Target and drafter on bf16 caches: half the cache bytes, greedy text
// near the fp32 cache's (--kv_cache_dtype model), and speculation (windows 4
// and 16, one and three passes, one and two threads) lossless against the
// bf16-cache target's own greedy decoding.
TEST_P(Bf16KvCacheTest, ModelsStayLossless) {
  const TinyModelSpec spec = SpecWithHeadsOf32();
  const std::vector<int32_t> prompt = testing::RandomPrompt(23, 128, 9);
  SetKvCacheDtype(KvCacheDtype::kModel);
  const auto f32_pair = testing::MakeTinyPair(spec, 41);
  SetKvCacheDtype(KvCacheDtype::kBf16);
  const auto pair = testing::MakeTinyPair(spec, 41);  // same weights
  ASSERT_TRUE(f32_pair->target->AddSequence(1).ok());
  ASSERT_TRUE(pair->target->AddSequence(1).ok());
  EXPECT_EQ(2 * pair->target->cache_bytes(), f32_pair->target->cache_bytes());
  ASSERT_TRUE(f32_pair->target->RemoveSequence(1).ok());
  ASSERT_TRUE(pair->target->RemoveSequence(1).ok());
  const std::vector<int32_t> greedy =
      testing::GreedyReference(*pair->target, prompt, 24);
  const std::vector<int32_t> greedy_f32 =
      testing::GreedyReference(*f32_pair->target, prompt, 24);
  size_t same = 0;
  while (same < greedy.size() && greedy[same] == greedy_f32[same]) ++same;
  EXPECT_GE(same, 8u);

  testing::ExpectLosslessSpeculation(*pair, prompt, greedy);
  EXPECT_EQ(pair->target->num_sequences(), 0u);
  EXPECT_EQ(pair->drafter->num_sequences(), 0u);
}

// A model whose heads the bf16 kernel does not take refuses to load, with
// the flag named, rather than falling back silently.
TEST_P(Bf16KvCacheTest, AModelTheKernelCannotServeRefusesToLoad) {
  TinyModelSpec spec = DefaultTinySpec();  // head_dim 16
  const std::string dir = ::testing::TempDir() + "/bf16_kv_hd16";
  ASSERT_TRUE(WriteRandomQwen3(dir, spec.target, 5).ok());
  Qwen3Model::Options options;
  auto model = Qwen3Model::Load(dir, options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("--kv_cache_dtype=bf16"));
}

// A bf16 model on the CPU keeps its bf16 pool on the ATen path (its queries
// are bf16; the row kernel reads fp32 queries): it loads and decodes under
// bf16 products and the default K/V dtype, as before the bf16 cache.
TEST_P(Bf16KvCacheTest, ABf16ModelKeepsTheAtenPath) {
  SetKvCacheDtype(KvCacheDtype::kAuto);
  const std::string dir = ::testing::TempDir() + "/bf16_model_hd32";
  ASSERT_TRUE(WriteRandomQwen3(dir, SpecWithHeadsOf32().target, 6).ok());
  Qwen3Model::Options options;
  options.dtype = at::kBFloat16;
  auto model = Qwen3Model::Load(dir, options);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> greedy =
      testing::GreedyReference(**model, testing::RandomPrompt(9, 128, 4), 6);
  EXPECT_EQ(greedy.size(), 6u);
}

INSTANTIATE_TEST_SUITE_P(Isas, Bf16KvCacheTest,
                         ::testing::Values(CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const auto& info) {
                           return std::string(CpuIsaName(info.param));
                         });

}  // namespace
}  // namespace dedit
