#include "common/model/sampling.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <array>
#include <cmath>
#include <map>
#include <set>

#include "gtest/gtest.h"

namespace dedit {
namespace {

TEST(SamplingTest, AcceptedPrefixLength) {
  EXPECT_EQ(AcceptedPrefixLength({}, {4}), 0);
  EXPECT_EQ(AcceptedPrefixLength({1, 2, 3}, {1, 2, 3, 9}), 3);
  EXPECT_EQ(AcceptedPrefixLength({1, 2, 3}, {1, 5, 3, 9}), 1);
  EXPECT_EQ(AcceptedPrefixLength({7, 2, 3}, {1, 2, 3, 9}), 0);
}

TEST(SamplingTest, ValidatesParams) {
  EXPECT_FALSE(ValidateSamplingParams({-1.0f}).ok());
  EXPECT_FALSE(ValidateSamplingParams({NAN}).ok());
  EXPECT_FALSE(ValidateSamplingParams({1.0f, -1}).ok());
  EXPECT_FALSE(ValidateSamplingParams({1.0f, 0, 0.0f}).ok());
  EXPECT_FALSE(ValidateSamplingParams({1.0f, 0, 1.5f}).ok());
  EXPECT_TRUE(ValidateSamplingParams({0.7f, 20, 0.9f}).ok());
}

TEST(SamplingTest, GreedyAndDegenerateFiltersPickArgmax) {
  at::Tensor logits = at::randn({6, 50});
  at::Tensor argmax = logits.argmax(-1);
  std::vector<SamplingParams> params = {
      {0.0f}, {1.0f, 1, 1.0f, 3, true}, {1.0f, 0, 1e-6f, 4, true}};
  for (const SamplingParams& p : params) {
    TokenSampler sampler(p);
    std::vector<int32_t> got = sampler.Choose(logits, 0);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(got[i], argmax[i].item<int64_t>());
  }
}

TEST(SamplingTest, SeedMakesSamplingReproducible) {
  at::Tensor logits = at::randn({16, 30});
  SamplingParams p{1.0f, 0, 1.0f, 1234, true};
  TokenSampler a(p), b(p);
  EXPECT_EQ(a.Choose(logits, 7), b.Choose(logits, 7));
  p.seed = 99;
  TokenSampler c(p);
  std::vector<int32_t> first = a.Choose(logits, 7), other = c.Choose(logits, 7);
  EXPECT_NE(first, other);
}

// Known-answer vectors of Random123's kat_vectors (philox4x32_10): zeros,
// all ones, and the digits of pi.
TEST(SamplingTest, PhiloxMatchesTheReferenceVectors) {
  using Words = std::array<uint32_t, 4>;
  EXPECT_EQ(Philox4x32({0, 0, 0, 0}, {0, 0}),
            (Words{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(Philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                       {0xffffffff, 0xffffffff}),
            (Words{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(Philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                       {0xa4093822, 0x299f31d0}),
            (Words{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// The draw for a position depends on (seed, position) only: a row chooses
// the same token alone, in a block, or after a move to another sampler
// (another target) with the same seed.
TEST(SamplingTest, DrawDependsOnSeedAndPositionOnly) {
  at::Tensor logits = at::randn({12, 40});
  SamplingParams p{0.8f, 0, 1.0f, 4242, true};
  TokenSampler block(p), moved(p);
  const std::vector<int32_t> all = block.Choose(logits, 100);
  for (int64_t r = 0; r < 12; ++r) {
    EXPECT_EQ(moved.Choose(logits.narrow(0, r, 1), 100 + r)[0], all[r]) << r;
  }
  // Consecutive positions are not one draw repeated.
  std::vector<int32_t> same_row;
  for (int64_t pos = 0; pos < 12; ++pos) {
    same_row.push_back(block.Choose(logits.narrow(0, 0, 1), pos)[0]);
  }
  EXPECT_GT(std::set<int32_t>(same_row.begin(), same_row.end()).size(), 1u);
  for (int64_t pos = 0; pos < 1000; ++pos) {
    const double u = PhiloxUniform(4242, pos);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

// The empirical distribution follows softmax(logits / T) restricted to the
// top-k / nucleus set (chi-square at p = 0.001).
TEST(SamplingTest, EmpiricalDistributionMatchesFilteredSoftmax) {
  const std::vector<float> raw = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -3.0f};
  at::Tensor logits = at::tensor(raw).unsqueeze(0);
  struct Case {
    float t;
    int k;
    float p;
  };
  for (const Case c :
       {Case{1.0f, 0, 1.0f}, Case{0.7f, 4, 1.0f}, Case{1.3f, 0, 0.8f}}) {
    at::Tensor probs = at::softmax(logits[0] / c.t, -1);
    std::vector<double> expected(raw.size());
    // Build the allowed set exactly as documented.
    double mass = 0, kept = 0;
    for (size_t i = 0; i < raw.size(); ++i) {
      const double pi = probs[i].item<double>();
      const bool in_k = c.k == 0 || static_cast<int>(i) < c.k;  // sorted input
      const bool in_p = mass < c.p;
      mass += pi;
      if (in_k && in_p) {
        expected[i] = pi;
        kept += pi;
      }
    }
    for (double& e : expected) e /= kept;
    TokenSampler sampler({c.t, c.k, c.p, 42, true});
    const int n = 20000;
    std::vector<int> counts(raw.size(), 0);
    at::Tensor batch = logits.expand({1000, static_cast<int64_t>(raw.size())});
    for (int i = 0; i < n / 1000; ++i) {
      for (int32_t t : sampler.Choose(batch, i * 1000)) ++counts[t];
    }
    double chi2 = 0;
    int cells = 0;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (expected[i] == 0) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " outside the allowed set";
        continue;
      }
      const double e = expected[i] * n;
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
      ++cells;
    }
    // chi-square critical values at p = 0.001 for dof 1..6.
    const double crit[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46};
    EXPECT_LT(chi2, crit[cells - 1])
        << "T=" << c.t << " k=" << c.k << " p=" << c.p;
  }
}

}  // namespace
}  // namespace dedit
