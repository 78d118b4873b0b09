// LargeArray (common/model/cpu/huge_pages.h): the weight panels' memory.
// Zeroed, aligned for the kernels' 64-byte loads, on a 2 MB boundary (so huge
// pages can back it) from kHugePageMin, and owned once across moves.
#include "common/model/cpu/huge_pages.h"

#include <cstdint>
#include <utility>

#include "gtest/gtest.h"

namespace dedit {
namespace {

TEST(LargeArrayTest, SmallAndLargeArraysAreZeroedAndAligned) {
  for (size_t n : {size_t{1}, size_t{1000}, kHugePageMin / 2 + 3,
                   3 * kHugePageMin / 2 + 5}) {
    LargeArray<uint16_t> a(n);
    ASSERT_NE(a.data(), nullptr) << n;
    EXPECT_EQ(a.size(), n);
    const auto at = reinterpret_cast<uintptr_t>(a.data());
    EXPECT_EQ(at % 64, 0u) << n;
    if (n * sizeof(uint16_t) >= kHugePageMin) {
      EXPECT_EQ(at % (size_t{2} << 20), 0u) << n;
    }
    bool zero = true;
    for (size_t i = 0; i < n; ++i) zero = zero && a[i] == 0;
    EXPECT_TRUE(zero) << n;
    a[n - 1] = 7;  // the whole range is writable
    EXPECT_EQ(a[n - 1], 7);
  }
}

TEST(LargeArrayTest, MovesHandOverTheMemory) {
  LargeArray<float> a(kHugePageMin);  // 8 MB: a mapping
  a[5] = 1.5f;
  float* const data = a.data();
  LargeArray<float> b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b[5], 1.5f);
  LargeArray<float> c(16);
  c = std::move(b);  // c's heap block is freed, b's mapping taken
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c.size(), kHugePageMin);
  LargeArray<float> empty;
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.size(), 0u);
}

}  // namespace
}  // namespace dedit
