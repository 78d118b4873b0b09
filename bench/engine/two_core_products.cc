// The few-row products of one forward (the production target's 12 layers
// and its 128 x 2048 head: 49 products) on one core against split across
// two, each half of every product's columns on one core, the second from
// a helper thread that spins between jobs
// (docs/log/2026-12-06-bench-notebook.md, "Few-row products on two cores").
// Standalone, not built by CMake:
//
//   clang++-14 -O2 -std=gnu++17 -D_GLIBCXX_USE_CXX11_ABI=1 -I. \
//     -isystem /usr/include/torch/csrc/api/include \
//     -I/usr/include/x86_64-linux-gnu/openblas-pthread \
//     bench/engine/two_core_products.cc -o /tmp/two_core \
//     -ltorch -ltorch_cpu -lc10 -lopenblas -lpthread
//   OPENBLAS_NUM_THREADS=1 /tmp/two_core
//
// Prints, for 1, 8 and 16 rows, the median time of the 49 products as one
// product each, in CpuMm's column blocks (common/model/cpu/cpu_kernels.cc), and
// as two halves on two threads.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "bench/engine/micro_timing.h"

template <class F>
double Us(F f, int n = 2000) {
  return dedit::bench::MedianUs(f, n, 200, 9);
}
struct Helper {
  std::atomic<const std::function<void()>*> job{nullptr};
  std::atomic<bool> stop{false};
  std::thread t;
  Helper() {
    t = std::thread([this] {
      while (!stop.load(std::memory_order_relaxed)) {
        auto* j = job.load(std::memory_order_acquire);
        if (j) {
          (*j)();
          job.store(nullptr, std::memory_order_release);
        }
      }
    });
  }
  ~Helper() {
    stop = true;
    t.join();
  }
  void Run(const std::function<void()>& f) {
    job.store(&f, std::memory_order_release);
  }
  void Wait() {
    while (job.load(std::memory_order_acquire)) {
    }
  }
};
// raw sgemm: out[R, n] (ld = N) = x[R, k] @ w[k, N] columns [c0, c1)
void Mm(const float* x, const float* w, float* out, int R, int k, int N, int c0,
        int c1) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, c1 - c0, k, 1.f, x,
              k, w + c0, N, 0.f, out + c0, N);
}
int main() {
  std::vector<std::pair<int, int>> shapes = {
      {128, 256}, {128, 128}, {128, 768}, {384, 128}};
  Helper h;
  for (int R : {1, 8, 16}) {
    std::vector<at::Tensor> ws;
    for (int l = 0; l < 12; ++l)
      for (auto [k, n] : shapes) ws.push_back(at::randn({k, n}));
    ws.push_back(at::randn({128, 2048}));
    at::Tensor x128 = at::randn({R, 128}), x384 = at::randn({R, 384});
    std::vector<at::Tensor> outs;
    for (auto& w : ws) outs.push_back(at::empty({R, w.size(1)}));
    auto blockof = [&](int64_t m, int64_t k, int64_t n) -> int64_t {
      const int64_t kSmall = 1000000, kMaxRows = 32, kMinCols = 16;
      if (m * k * n <= kSmall || m > kMaxRows) return n;
      const int64_t b = kSmall / (m * k) / kMinCols * kMinCols;
      return b < kMinCols ? n : std::min(b, n);
    };
    auto split1 = [&] {
      for (size_t i = 0; i < ws.size(); ++i) {
        auto& w = ws[i];
        at::Tensor x = w.size(0) == 384 ? x384 : x128;
        const int n = w.size(1), k = w.size(0);
        const int64_t b = blockof(R, k, n);
        for (int64_t j = 0; j < n; j += b)
          Mm(x.data_ptr<float>(), w.data_ptr<float>(),
             outs[i].data_ptr<float>(), R, k, n, j,
             std::min<int64_t>(n, j + b));
      }
    };
    auto one = [&] {
      for (size_t i = 0; i < ws.size(); ++i) {
        auto& w = ws[i];
        at::Tensor x = w.size(0) == 384 ? x384 : x128;
        Mm(x.data_ptr<float>(), w.data_ptr<float>(), outs[i].data_ptr<float>(),
           R, w.size(0), w.size(1), 0, w.size(1));
      }
    };
    auto two = [&] {
      for (size_t i = 0; i < ws.size(); ++i) {
        auto& w = ws[i];
        at::Tensor x = w.size(0) == 384 ? x384 : x128;
        const int n = w.size(1), half = (n / 2 + 15) / 16 * 16;
        const float* xp = x.data_ptr<float>();
        const float* wp = w.data_ptr<float>();
        float* op = outs[i].data_ptr<float>();
        const int k = w.size(0);
        std::function<void()> f = [&] { Mm(xp, wp, op, R, k, n, half, n); };
        h.Run(f);
        Mm(xp, wp, op, R, k, n, 0, half);
        h.Wait();
      }
    };
    for (int rep = 0; rep < 2; ++rep)
      printf(
          "rows %2d: one product each %.1f us, CpuMm column blocks %.1f us, "
          "two halves on two threads (spinning helper) %.1f us (49 products)\n",
          R, Us(one, 300), Us(split1, 300), Us(two, 300));
  }
}
