// Few-row products: OpenBLAS's sgemm against a hand-written register-tiled
// kernel (docs/log/2026-12-06-bench-notebook.md, "Few-row products on another
// host"). Standalone, not built by CMake (it tests whether the engine should
// carry its own kernel; it should not, see that section):
//
//   clang++-14 -O2 -std=c++17 bench/engine/few_rows_gemm.cc -o /tmp/few_rows \
//     -I/usr/include/x86_64-linux-gnu/openblas-pthread -lopenblas
//   OPENBLAS_NUM_THREADS=1 /tmp/few_rows
//
// For 1..32 rows it times the 12 layers' four products of the production
// target shape (hidden 128, packed QKV 256, output 128, packed gate/up 768,
// down 384 x 128) plus the 128 x 2048 head, with distinct weights per layer,
// 15 alternating repetitions of 50 forwards each, and prints the minimum and
// median per forward for OpenBLAS, the AVX-512 tile and the AVX2 tile.
#include <cblas.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

template <int VW>
struct V {
  typedef float type __attribute__((vector_size(VW * 4), aligned(4)));
};

template <int VW, int MR>
__attribute__((always_inline)) inline void Tile(const float* x, long ldx,
                                                const float* w, long n, long k,
                                                float* y, long ldy) {
  typedef typename V<VW>::type vec;
  vec acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = vec{};
  for (long kk = 0; kk < k; ++kk) {
    vec w0, w1;
    std::memcpy(&w0, w + kk * n, sizeof(vec));
    std::memcpy(&w1, w + kk * n + VW, sizeof(vec));
    for (int r = 0; r < MR; ++r) {
      const float xs = x[r * ldx + kk];
      acc[r][0] += xs * w0;
      acc[r][1] += xs * w1;
    }
  }
  for (int r = 0; r < MR; ++r) {
    std::memcpy(y + r * ldy, &acc[r][0], sizeof(vec));
    std::memcpy(y + r * ldy + VW, &acc[r][1], sizeof(vec));
  }
}

template <int VW, int MRMAX>
__attribute__((always_inline)) inline void Mm(const float* x, long m, long k,
                                              const float* w, long n,
                                              float* y) {
  for (long j = 0; j < n; j += 2 * VW) {
    long i = 0;
    for (; i + MRMAX <= m; i += MRMAX)
      Tile<VW, MRMAX>(x + i * k, k, w + j, n, k, y + i * n + j, n);
    switch (m - i) {
#define C(R)                                                    \
  case R:                                                       \
    if constexpr (R < MRMAX)                                    \
      Tile<VW, R>(x + i * k, k, w + j, n, k, y + i * n + j, n); \
    break;
      C(1) C(2) C(3) C(4) C(5) C(6) C(7) default : break;
    }
  }
}
__attribute__((target("avx512f,avx512vl,fma"))) void Mm512(const float* x,
                                                           long m, long k,
                                                           const float* w,
                                                           long n, float* y) {
  Mm<16, 8>(x, m, k, w, n, y);
}
__attribute__((target("avx2,fma"))) void Mm256(const float* x, long m, long k,
                                               const float* w, long n,
                                               float* y) {
  Mm<8, 6>(x, m, k, w, n, y);
}

#include <algorithm>
int main(int argc, char** argv) {
  struct L {
    std::vector<float> q, o, g, d;
  };
  std::vector<L> Ls(12);
  for (auto& l : Ls) {
    l.q.resize(128 * 256);
    l.o.resize(128 * 128);
    l.g.resize(128 * 768);
    l.d.resize(384 * 128);
    for (auto* v : {&l.q, &l.o, &l.g, &l.d})
      for (auto& f : *v) f = rand() / (float)RAND_MAX - 0.5f;
  }
  std::vector<float> head(128 * 2048);
  for (auto& f : head) f = rand() / (float)RAND_MAX - .5f;
  printf("ms per forward (min, median): OpenBLAS, AVX-512 tile, AVX2 tile\n");
  for (int m : {1, 4, 8, 16, 32}) {
    std::vector<float> x(m * 384), y(m * 2048);
    for (auto& f : x) f = rand() / (float)RAND_MAX - 0.5f;
    std::vector<double> t3[3];
    for (int rep = 0; rep < 15; ++rep)
      for (int which = 0; which < 3; ++which) {
        auto mm = [&](const float* a, long k, const float* b, long n,
                      float* c) {
          if (which == 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f,
                        a, k, b, n, 0.f, c, n);
          else if (which == 1)
            Mm512(a, m, k, b, n, c);
          else
            Mm256(a, m, k, b, n, c);
        };
        auto f = [&] {
          for (auto& l : Ls) {
            mm(x.data(), 128, l.q.data(), 256, y.data());
            mm(x.data(), 128, l.o.data(), 128, y.data());
            mm(x.data(), 128, l.g.data(), 768, y.data());
            mm(x.data(), 384, l.d.data(), 128, y.data());
          }
          mm(x.data(), 128, head.data(), 2048, y.data());
        };
        f();
        auto t = std::chrono::steady_clock::now();
        int R = 50;
        for (int i = 0; i < R; ++i) f();
        t3[which].push_back(std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - t)
                                .count() /
                            R);
      }
    // The head's product by each kernel against OpenBLAS's.
    std::vector<float> ref(m * 2048), mine(m * 2048);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, 2048, 128, 1.f,
                x.data(), 128, head.data(), 2048, 0.f, ref.data(), 2048);
    double diff = 0;
    for (int which = 1; which < 3; ++which) {
      (which == 1 ? Mm512 : Mm256)(x.data(), m, 128, head.data(), 2048,
                                   mine.data());
      for (int i = 0; i < m * 2048; ++i)
        diff = std::max(diff, (double)std::fabs(mine[i] - ref[i]));
    }
    printf("m=%d", m);
    for (auto& v : t3) {
      std::sort(v.begin(), v.end());
      printf("  min %.3f med %.3f", v[0], v[v.size() / 2]);
    }
    printf("  max |tile - OpenBLAS| %.3g\n", diff);
  }
}
