#include "common/model/kv_pool.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <map>

#include "absl/cleanup/cleanup.h"
#include "common/model/cpu/cpu_attention.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/packed_attention.h"
#include "common/model/transformer_ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"

namespace dedit {
namespace {

using ::testing::HasSubstr;
using testing::TestDevice;

KvPool::Shape SmallShape() {
  KvPool::Shape s;
  s.num_layers = 2;
  s.kv_heads = 2;
  s.head_dim = 4;
  s.max_tokens = 16;
  return s;
}

// Writes `n` tokens of random K/V for `id` at [start, start + n) of every
// layer and moves its length; returns them ([layer] of [n, kv, hd]).
std::vector<std::pair<at::Tensor, at::Tensor>> Append(KvPool& pool,
                                                      SequenceId id,
                                                      int64_t start,
                                                      int64_t n) {
  const KvPool::Shape& s = pool.shape();
  pool.Reserve(start + n);
  std::vector<int64_t> rows;
  pool.AppendRows(pool.Slot(id), start, n, &rows);
  at::Tensor index = at::tensor(rows, at::kLong).to(TestDevice());
  std::vector<std::pair<at::Tensor, at::Tensor>> written;
  for (int l = 0; l < s.num_layers; ++l) {
    at::Tensor k = at::randn({n, s.kv_heads, s.head_dim}).to(TestDevice());
    at::Tensor v = at::randn({n, s.kv_heads, s.head_dim}).to(TestDevice());
    pool.Write(l, index, k, v);
    written.emplace_back(k, v);
  }
  pool.SetLength(id, start + n);
  return written;
}

// K of `id` at positions [start, start + n) of `layer`: [n, kv, hd].
at::Tensor KeysOf(const KvPool& pool, SequenceId id, int layer, int64_t start,
                  int64_t n) {
  return pool.keys(layer)[pool.Slot(id)].narrow(1, start, n).transpose(0, 1);
}

TEST(KvPoolTest, AppendWritesInPlaceAndTruncateOnlyMovesTheLength) {
  KvPool pool(SmallShape(), at::kFloat, TestDevice(), /*initial_slots=*/2,
              /*max_slots=*/8, /*initial_slab_tokens=*/16);
  ASSERT_TRUE(pool.Add(1).ok());
  const void* storage = pool.keys(0).data_ptr();
  auto first = Append(pool, 1, 0, 5);
  auto second = Append(pool, 1, 5, 3);
  EXPECT_EQ(pool.Length(1), 8);
  // Appending never reallocated.
  EXPECT_EQ(pool.keys(0).data_ptr(), storage);
  EXPECT_TRUE(at::equal(KeysOf(pool, 1, 1, 0, 5), first[1].first));
  EXPECT_TRUE(at::equal(KeysOf(pool, 1, 1, 5, 3), second[1].first));
  // Truncate, then overwrite the dropped positions.
  pool.SetLength(1, 6);
  EXPECT_EQ(pool.Length(1), 6);
  auto rewritten = Append(pool, 1, 6, 2);
  EXPECT_TRUE(at::equal(KeysOf(pool, 1, 0, 0, 5), first[0].first));
  EXPECT_TRUE(at::equal(KeysOf(pool, 1, 0, 6, 2), rewritten[0].first));
  EXPECT_EQ(pool.total_length(), 8);
}

// The CPU row path's copy: the same cache as Write, from strided k and v
// (views of a packed projection, as ProjectQkv gives them).
TEST(KvPoolTest, WriteRowsEqualsWrite) {
  if (!TestDevice().is_cpu()) GTEST_SKIP() << "a CPU path";
  const KvPool::Shape shape = SmallShape();
  KvPool by_rows(shape, at::kFloat, TestDevice(), 4);
  KvPool by_index(shape, at::kFloat, TestDevice(), 4);
  for (SequenceId id : {1, 2}) {
    ASSERT_TRUE(by_rows.Add(id).ok());
    ASSERT_TRUE(by_index.Add(id).ok());
  }
  by_rows.Reserve(12);
  by_index.Reserve(12);
  std::vector<int64_t> rows;
  by_rows.AppendRows(by_rows.Slot(2), 3, 5, &rows);
  by_rows.AppendRows(by_rows.Slot(1), 0, 4, &rows);
  const at::Tensor packed = at::randn({9, 3 * shape.kv_heads, shape.head_dim});
  const at::Tensor k = packed.narrow(1, 0, shape.kv_heads);
  const at::Tensor v = packed.narrow(1, 2 * shape.kv_heads, shape.kv_heads);
  ASSERT_FALSE(k.is_contiguous());
  by_rows.WriteRows(1, rows, k, v);
  by_index.Write(1, at::tensor(rows, at::kLong), k, v);
  EXPECT_TRUE(at::equal(by_rows.keys(1), by_index.keys(1)));
  EXPECT_TRUE(at::equal(by_rows.values(1), by_index.values(1)));
  EXPECT_TRUE(at::equal(by_rows.keys(0), by_index.keys(0)));  // untouched
}

TEST(KvPoolTest, SlabsGrowByDoublingUpToTheLimitKeepingData) {
  KvPool pool(SmallShape(), at::kFloat, TestDevice(), /*initial_slots=*/2,
              /*max_slots=*/8, /*initial_slab_tokens=*/3);
  EXPECT_EQ(pool.slab_tokens(), 3);
  ASSERT_TRUE(pool.Add(1).ok());
  ASSERT_TRUE(pool.Add(2).ok());
  auto a = Append(pool, 1, 0, 2);
  auto b = Append(pool, 2, 0, 3);
  auto a2 = Append(pool, 1, 2, 3);  // 5 tokens: 3 → 6
  EXPECT_EQ(pool.slab_tokens(), 6);
  pool.Reserve(11);  // 6 → 12, capped at 16 later
  EXPECT_EQ(pool.slab_tokens(), 12);
  pool.Reserve(16);
  EXPECT_EQ(pool.slab_tokens(), 16);
  EXPECT_TRUE(at::equal(KeysOf(pool, 1, 1, 0, 2), a[1].first));
  EXPECT_TRUE(at::equal(KeysOf(pool, 1, 1, 2, 3), a2[1].first));
  EXPECT_TRUE(at::equal(KeysOf(pool, 2, 0, 0, 3), b[0].first));
  EXPECT_EQ(pool.Length(2), 3);
}

// A forward (in InferenceMode) may grow the pool; adding and removing
// sequences happens outside it, and must still be able to clear and move
// slabs (libtorch refuses in-place updates of inference tensors outside
// InferenceMode).
TEST(KvPoolTest, GrownInsideInferenceModeStillWorksOutside) {
  KvPool pool(SmallShape(), at::kFloat, TestDevice(), /*initial_slots=*/1,
              /*max_slots=*/8, /*initial_slab_tokens=*/2);
  {
    c10::InferenceMode inference_mode;
    ASSERT_TRUE(pool.Add(1).ok());
    ASSERT_TRUE(pool.Add(2).ok());  // grows the slots
    Append(pool, 1, 0, 5);          // grows the slab
    Append(pool, 2, 0, 3);
  }
  ASSERT_TRUE(pool.Remove(1).ok());  // moves 2 into slot 0
  ASSERT_TRUE(pool.Add(3).ok());     // clears slot 1
  Append(pool, 3, 0, 4);
  pool.Reserve(12);
  EXPECT_EQ(pool.Length(2), 3);
  EXPECT_EQ(pool.Length(3), 4);
}

TEST(KvPoolTest, ReleaseKeepsSlotsDenseAndDataIntact) {
  KvPool pool(SmallShape(), at::kFloat, TestDevice(), /*initial_slots=*/4);
  for (SequenceId id : {10, 11, 12}) ASSERT_TRUE(pool.Add(id).ok());
  auto a = Append(pool, 10, 0, 4);
  auto c = Append(pool, 12, 0, 7);
  EXPECT_EQ(pool.Slot(12), 2);
  ASSERT_TRUE(pool.Remove(10).ok());
  EXPECT_EQ(pool.size(), 2u);
  EXPECT_FALSE(pool.Contains(10));
  // The last sequence moved into the hole with its tokens.
  EXPECT_EQ(pool.Slot(12), 0);
  EXPECT_EQ(pool.Length(12), 7);
  EXPECT_TRUE(at::equal(KeysOf(pool, 12, 1, 0, 7), c[1].first));
  EXPECT_TRUE(at::equal(pool.values(1)[0].narrow(1, 0, 7).transpose(0, 1),
                        c[1].second));
  // A new sequence gets a fresh, zeroed slab.
  ASSERT_TRUE(pool.Add(13).ok());
  EXPECT_EQ(pool.Length(13), 0);
  EXPECT_EQ(pool.keys(0)[pool.Slot(13)].abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(pool.Remove(10).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.Add(12).code(), absl::StatusCode::kAlreadyExists);
}

TEST(KvPoolTest, ReusedSlotsAreClearedOfStaleValues) {
  KvPool pool(SmallShape(), at::kFloat, TestDevice(), /*initial_slots=*/1);
  ASSERT_TRUE(pool.Add(1).ok());
  Append(pool, 1, 0, 9);
  {
    c10::InferenceMode inference_mode;  // the pool's tensors are inference
    pool.keys(0)[0].fill_(std::numeric_limits<float>::quiet_NaN());
  }
  ASSERT_TRUE(pool.Remove(1).ok());
  ASSERT_TRUE(pool.Add(2).ok());
  EXPECT_FALSE(pool.keys(0)[0].narrow(1, 0, 9).isnan().any().item<bool>());
}

TEST(KvPoolTest, GrowsByDoublingUpToTheLimitThenIsExhausted) {
  KvPool pool(SmallShape(), at::kFloat, TestDevice(), /*initial_slots=*/1,
              /*max_slots=*/3);
  ASSERT_TRUE(pool.Add(1).ok());
  auto a = Append(pool, 1, 0, 6);
  ASSERT_TRUE(pool.Add(2).ok());  // grows 1 → 2, copying
  ASSERT_TRUE(pool.Add(3).ok());  // 2 → 3 (capped)
  EXPECT_EQ(pool.capacity_slots(), 3);
  EXPECT_TRUE(at::equal(KeysOf(pool, 1, 0, 0, 6), a[0].first));
  absl::Status full = pool.Add(4);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("KV pool full"));
  // Releasing makes room again.
  ASSERT_TRUE(pool.Remove(2).ok());
  EXPECT_TRUE(pool.Add(4).ok());
  EXPECT_GT(pool.nbytes(), 0);
}

// A parked sequence (a session between turns) keeps exactly its tokens
// outside the slots, counts as a sequence, rolls back, and comes back
// into a slot with the same K/V; the others keep theirs through the moves.
TEST(KvPoolTest, ParkedSequencesKeepTheirTokensOutsideTheSlots) {
  KvPool pool(SmallShape(), at::kFloat, TestDevice(), /*initial_slots=*/2,
              /*max_slots=*/8, /*initial_slab_tokens=*/16);
  for (SequenceId id : {1, 2, 3}) ASSERT_TRUE(pool.Add(id).ok());
  auto a = Append(pool, 1, 0, 5);
  auto b = Append(pool, 2, 0, 9);
  auto c = Append(pool, 3, 0, 3);
  const int64_t token_bytes = pool.used_bytes() / pool.total_length();
  EXPECT_EQ(token_bytes, 2 * 2 * 2 * 4 * 4);  // K+V, layers, kv, hd, fp32
  ASSERT_TRUE(pool.Park(2).ok());
  EXPECT_TRUE(pool.Parked(2));
  EXPECT_EQ(pool.size(), 2u);       // resident
  EXPECT_EQ(pool.sequences(), 3u);  // all
  EXPECT_EQ(pool.Length(2), 9);
  EXPECT_EQ(pool.total_length(), 17);
  EXPECT_TRUE(pool.Park(2).ok());  // already parked: nothing
  EXPECT_TRUE(at::equal(KeysOf(pool, 3, 1, 0, 3), c[1].first));
  pool.SetLength(2, 7);  // a rollback while parked
  ASSERT_TRUE(pool.MakeResident(2).ok());
  EXPECT_EQ(pool.Length(2), 7);
  EXPECT_TRUE(at::equal(KeysOf(pool, 2, 0, 0, 7), b[0].first.narrow(0, 0, 7)));
  EXPECT_TRUE(at::equal(KeysOf(pool, 2, 1, 0, 7), b[1].first.narrow(0, 0, 7)));
  EXPECT_TRUE(at::equal(KeysOf(pool, 1, 1, 0, 5), a[1].first));
  // Parked and removed: gone, its bytes too.
  const int64_t held = pool.nbytes();
  ASSERT_TRUE(pool.Park(1).ok());
  EXPECT_EQ(pool.nbytes(), held + 5 * token_bytes);
  ASSERT_TRUE(pool.Remove(1).ok());
  EXPECT_EQ(pool.nbytes(), held);
  EXPECT_FALSE(pool.Contains(1));
  EXPECT_EQ(pool.Park(1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pool.MakeResident(1).code(), absl::StatusCode::kNotFound);
}

// After a burst (many sequences, one long one) the pool halves back while
// at most a quarter is used, keeping what the remaining sequences hold,
// and idle sequences parked cost their own tokens.
TEST(KvPoolTest, ShrinksBackAfterABurst) {
  KvPool::Shape shape = SmallShape();
  shape.max_tokens = 256;
  KvPool pool(shape, at::kFloat, TestDevice(), /*initial_slots=*/2,
              /*max_slots=*/64, /*initial_slab_tokens=*/8);
  const int64_t initial_bytes = pool.nbytes();
  for (SequenceId id = 1; id <= 32; ++id) ASSERT_TRUE(pool.Add(id).ok());
  std::map<SequenceId, std::vector<std::pair<at::Tensor, at::Tensor>>> kv;
  for (SequenceId id = 1; id <= 32; ++id) kv[id] = Append(pool, id, 0, 5);
  Append(pool, 32, 5, 200);  // the long one: the slab grows to 205
  EXPECT_EQ(pool.capacity_slots(), 32);
  EXPECT_EQ(pool.slab_tokens(), 205);
  const int64_t peak = pool.nbytes();
  ASSERT_TRUE(pool.Remove(32).ok());
  EXPECT_EQ(pool.slab_tokens(), 10);  // twice the longest left (5 tokens)
  // Sessions kept idle: parked, each its own 5 tokens.
  for (SequenceId id = 3; id <= 31; ++id) ASSERT_TRUE(pool.Park(id).ok());
  EXPECT_LE(pool.capacity_slots(), 8);
  const int64_t token_bytes = pool.used_bytes() / pool.total_length();
  EXPECT_EQ(pool.nbytes(), int64_t{pool.capacity_slots()} * 10 * token_bytes +
                               29 * 5 * token_bytes);
  EXPECT_LT(pool.nbytes(), peak / 20);
  for (SequenceId id = 1; id <= 31; ++id) {
    ASSERT_TRUE(pool.MakeResident(id).ok());
    EXPECT_TRUE(at::equal(KeysOf(pool, id, 1, 0, 5), kv[id][1].first)) << id;
  }
  for (SequenceId id = 1; id <= 31; ++id) ASSERT_TRUE(pool.Remove(id).ok());
  EXPECT_EQ(pool.capacity_slots(), 2);
  EXPECT_EQ(pool.nbytes(), initial_bytes);
}

// Packed attention over the pool equals the per-sequence reference
// (GroupedAttention) for a mix of prefill chunks, decode steps and
// bidirectional or block-causal drafter blocks, on sparse slots, with and
// without query chunking.
// PackedAttention over batches of every segment kind against
// GroupedAttention per sequence; `row_kernel`: whether the CPU's
// row-at-a-time kernel (common/model/cpu/cpu_attention.h) must have run.
void CheckAgainstPerSequenceReference(int64_t head_dim, bool row_kernel) {
  KvPool::Shape shape;
  shape.num_layers = 1;
  shape.kv_heads = 2;
  shape.head_dim = head_dim;
  shape.max_tokens = 40;
  const int heads = 6;  // group 3
  KvPool pool(shape, at::kFloat, TestDevice(), 2);
  struct Case {
    SequenceId id;
    int64_t cached, length;
    bool causal;
  };
  const std::vector<Case> cases = {{1, 0, 9, true},    // prefill
                                   {2, 17, 1, true},   // decode
                                   {3, 5, 6, false},   // bidirectional block
                                   {4, 30, 1, true},   // unused in batch 2
                                   {5, 12, 7, true}};  // verify block
  for (const Case& c : cases) {
    ASSERT_TRUE(pool.Add(c.id).ok());
    if (c.cached > 0) Append(pool, c.id, 0, c.cached);
  }
  // Batches: everything; a gap in the slot range (padded rows); a decode
  // batch over consecutive slots (no gathers); one decode token alone (no
  // gathers, no mask).
  const std::vector<std::vector<Case>> batches = {
      cases,
      {cases[0], cases[1], cases[2], cases[4]},
      {{1, 0, 1, true}, {2, 17, 1, true}, {3, 5, 1, true}},
      {{5, 12, 1, true}},
      // A long prefill chunk beside decode steps: two length groups.
      {{1, 0, 1, true}, {4, 3, 25, true}, {2, 17, 1, true}, {3, 5, 1, true}},
      // A verify block alone, and one beside a bidirectional drafter
      // block: no row blocks the context's keys, so only the columns from
      // the first blocked one on are masked.
      {{5, 12, 7, true}},
      {{3, 5, 6, false}, {5, 12, 6, true}}};
  for (const std::vector<Case>& batch : batches) {
    for (const int64_t budget : {int64_t{64} << 20, int64_t{200}}) {
      std::vector<AttentionSegment> segs;
      int64_t n = 0;
      for (const Case& c : batch) {
        segs.push_back({pool.Slot(c.id), c.cached, c.length, c.causal});
        n += c.length;
      }
      int64_t longest = 0;
      for (const Case& c : batch) {
        longest = std::max(longest, c.cached + c.length);
      }
      pool.Reserve(longest);
      PackedAttention attention(segs, pool, heads, budget);
      if (row_kernel) {
        EXPECT_EQ(attention.num_groups(), 0u);  // no padded groups
      } else if (batch.size() == 4 && batch[1].length == 25) {
        EXPECT_EQ(attention.num_groups(), 2u);
      }
      at::Tensor q = at::randn({n, heads, shape.head_dim}).to(TestDevice());
      at::Tensor k =
          at::randn({n, shape.kv_heads, shape.head_dim}).to(TestDevice());
      at::Tensor v = at::randn_like(k);
      attention.WriteKv(&pool, 0, k, v);
      // Run takes q pre-scaled (ProjectQkv folds the scale in).
      at::Tensor out = attention.Run(
          q / std::sqrt(static_cast<double>(shape.head_dim)), pool, 0);
      ASSERT_EQ(out.size(0), n);
      int64_t off = 0;
      for (const Case& c : batch) {
        const int slot = pool.Slot(c.id);
        const int64_t total = c.cached + c.length;
        at::Tensor keys = pool.keys(0)[slot].narrow(1, 0, total);
        at::Tensor values = pool.values(0)[slot].narrow(1, 0, total);
        at::Tensor ref = GroupedAttention(q.narrow(0, off, c.length), keys,
                                          values, c.causal ? c.cached : -1,
                                          /*block_causal_from=*/-1);
        const double diff =
            (out.narrow(0, off, c.length) - ref).abs().max().item<double>();
        EXPECT_LT(diff, 1e-5) << "sequence " << c.id << " in a batch of "
                              << batch.size() << ", budget " << budget;
        off += c.length;
      }
    }
  }
}

TEST(PackedAttentionTest, EqualsPerSequenceReference) {
  CheckAgainstPerSequenceReference(8, false);
  CheckAgainstPerSequenceReference(32, false);
}

// Under --cpu_products f32|bf16 an fp32 CPU pool runs the row kernel: the
// same attention, for head sizes of one and several 16-lane chunks, on each
// ISA this CPU runs it on.
TEST(PackedAttentionTest, CpuRowKernelEqualsPerSequenceReference) {
  if (!TestDevice().is_cpu() || !CpuAttentionRuns(16)) {
    GTEST_SKIP() << "needs the CPU and AVX2+FMA or AVX-512";
  }
  SetCpuProducts(CpuProducts::kF32);
  absl::Cleanup blas = [] { SetCpuProducts(CpuProducts::kBlas); };
  for (CpuIsa isa : testing::CpuIsasRunning(CpuProducts::kF32)) {
    SCOPED_TRACE(CpuIsaName(isa));
    testing::ScopedCpuIsaCap cap(isa);
    CheckAgainstPerSequenceReference(16, true);
    CheckAgainstPerSequenceReference(32, true);
    CheckAgainstPerSequenceReference(128, true);
    // A head size the kernel does not take keeps the matmul path.
    CheckAgainstPerSequenceReference(8, false);
  }
}

// Query heads that share a kv head run together (each key and value
// loaded once for the group): every head's output must equal, to the bit,
// the one it gets alone, here with each head given its own copy of its kv
// head (kv_heads = heads, one head per call). Head sizes of one, two,
// four and seven 16-lane chunks (two heads a call on AVX-512; on AVX2 only
// one chunk), and eight (one head a call either way); key counts around the
// 8- and 16-key blocks. On each ISA this CPU runs the kernel on.
TEST(PackedAttentionTest, CpuRowKernelGroupedHeadsEqualOneHeadAtATimeToTheBit) {
  if (!CpuAttentionRuns(16)) GTEST_SKIP() << "needs AVX2+FMA or AVX-512";
  const int heads = 4, kv_heads = 2, slots = 3;
  const int64_t slab = 48;
  const std::vector<int32_t> slot = {2, 0, 1, 2, 0, 1, 0};
  const std::vector<int64_t> visible = {1, 15, 16, 17, 33, 48, 9};
  const int64_t n = static_cast<int64_t>(slot.size());
  for (CpuIsa isa : testing::CpuIsasRunning(CpuProducts::kF32)) {
    for (const int64_t hd : {16, 32, 64, 112, 128}) {
      SCOPED_TRACE(CpuIsaName(isa));
      testing::ScopedCpuIsaCap cap(isa);
      at::Tensor q = at::randn({n, heads * hd});
      at::Tensor keys = at::randn({slots, kv_heads, slab, hd});
      at::Tensor values = at::randn({slots, kv_heads, slab, hd});
      CpuAttentionRows rows{n, slot.data(), visible.data()};
      at::Tensor grouped = at::empty({n, heads * hd});
      CpuAttention(q.data_ptr<float>(), q.stride(0), rows, heads, kv_heads, hd,
                   keys.data_ptr<float>(), values.data_ptr<float>(), slab,
                   grouped.data_ptr<float>(), nullptr);
      // Head h's own copy of kv head h / 2.
      at::Tensor head_of =
          at::arange(heads, at::kLong).div(heads / kv_heads, "floor");
      at::Tensor keys1 = keys.index_select(1, head_of).contiguous();
      at::Tensor values1 = values.index_select(1, head_of).contiguous();
      at::Tensor alone = at::empty({n, heads * hd});
      CpuAttention(q.data_ptr<float>(), q.stride(0), rows, heads, heads, hd,
                   keys1.data_ptr<float>(), values1.data_ptr<float>(), slab,
                   alone.data_ptr<float>(), nullptr);
      EXPECT_TRUE(at::equal(grouped, alone)) << "head size " << hd;
      // And both are attention.
      for (int64_t r = 0; r < n; ++r) {
        for (int h = 0; h < heads; ++h) {
          at::Tensor k = keys[slot[r]][h / 2].narrow(0, 0, visible[r]);
          at::Tensor v = values[slot[r]][h / 2].narrow(0, 0, visible[r]);
          at::Tensor qh = q[r].narrow(0, h * hd, hd);
          at::Tensor ref = at::softmax(at::mv(k, qh), 0).matmul(v);
          EXPECT_LT((grouped[r].narrow(0, h * hd, hd) - ref)
                        .abs()
                        .max()
                        .item<float>(),
                    1e-5)
              << "row " << r << " head " << h << " head size " << hd;
        }
      }
    }
  }
}

}  // namespace
}  // namespace dedit
