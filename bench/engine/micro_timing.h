// Median time of a callable, for the standalone microbenchmarks in
// bench/engine/ (decode_attention_micro.cc, two_core_products.cc; built by
// hand with -I. from the repository root, not by CMake).
#ifndef DEDIT_BENCH_ENGINE_MICRO_TIMING_H_
#define DEDIT_BENCH_ENGINE_MICRO_TIMING_H_

#include <algorithm>
#include <chrono>
#include <vector>

namespace dedit::bench {

// Runs f `warm_up` times, then `samples` times `n` calls; returns the
// median over the samples of the mean µs per call.
template <class F>
double MedianUs(F f, int n, int warm_up = 100, int samples = 7) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < warm_up; ++i) f();
  std::vector<double> us;
  for (int r = 0; r < samples; ++r) {
    const auto t = Clock::now();
    for (int i = 0; i < n; ++i) f();
    us.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - t).count() /
        n);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace dedit::bench

#endif  // DEDIT_BENCH_ENGINE_MICRO_TIMING_H_
