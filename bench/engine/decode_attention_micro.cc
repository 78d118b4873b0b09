// Decode/verify attention: the engine's batched products (PackedAttention's
// path: bmm, softmax, bmm) against a hand-written fused loop (scores per
// query row, ATen's softmax, weighted values), on the target's shapes (4
// heads, 2 kv heads, head_dim 32). Standalone, not built by CMake (it tests
// whether the engine should carry its own attention kernel; it should not, see
// docs/log/2026-12-06-bench-notebook.md, "A batched decode forward"):
//
//   clang++-14 -O2 -std=gnu++17 -D_GLIBCXX_USE_CXX11_ABI=1 -I. \
//     -isystem /usr/include/torch/csrc/api/include \
//     bench/engine/decode_attention_micro.cc -o /tmp/att \
//     -ltorch -ltorch_cpu -lc10 && /tmp/att
//
// (add -march=x86-64-v3 for the AVX2 figures). Prints, per shape (slots x
// query rows per slot, keys), the largest difference between the two and
// the median time per call of each, one thread.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "bench/engine/micro_timing.h"

template <class F>
double Us(F f, int n = 2000) {
  return dedit::bench::MedianUs(f, n, 100, 7);
}
inline float Dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int d = 0;
  for (; d + 8 <= n; d += 8)
    for (int u = 0; u < 8; ++u) acc[u] += a[d + u] * b[d + u];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) +
            ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; d < n; ++d) s += a[d] * b[d];
  return s;
}
// segments: S slots each with `rows` queries at start, causal; q [S*rows, H,
// hd]
at::Tensor Fused(const at::Tensor& q, const float* K, const float* V, int S,
                 int rows, int start, int H, int KV, int hd, int slab) {
  const int G = H / KV, maxk = start + rows;
  at::Tensor scores = at::empty({(int64_t)S * rows * H, maxk});
  float* sc = scores.data_ptr<float>();
  const float* qp = q.data_ptr<float>();
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < rows; ++i) {
      const int limit = start + i + 1;
      for (int h = 0; h < H; ++h) {
        const int kvh = h / G;
        const float* kb = K + ((int64_t)s * KV + kvh) * slab * hd;
        const float* qv = qp + (((int64_t)s * rows + i) * H + h) * hd;
        float* out = sc + (((int64_t)s * rows + i) * H + h) * maxk;
        for (int j = 0; j < limit; ++j)
          out[j] = Dot(qv, kb + (int64_t)j * hd, hd);
        for (int j = limit; j < maxk; ++j) out[j] = -INFINITY;
      }
    }
  at::Tensor probs = at::softmax(scores, -1);
  const float* pp = probs.data_ptr<float>();
  at::Tensor o = at::empty({(int64_t)S * rows, H * hd});
  float* op = o.data_ptr<float>();
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < rows; ++i) {
      const int limit = start + i + 1;
      for (int h = 0; h < H; ++h) {
        const int kvh = h / G;
        const float* vb = V + ((int64_t)s * KV + kvh) * slab * hd;
        const float* p = pp + (((int64_t)s * rows + i) * H + h) * maxk;
        float* ov = op + (((int64_t)s * rows + i) * H + h) * hd;
        for (int d = 0; d < hd; ++d) ov[d] = 0;
        for (int j = 0; j < limit; ++j) {
          const float w = p[j];
          const float* vr = vb + (int64_t)j * hd;
          for (int d = 0; d < hd; ++d) ov[d] += w * vr[d];
        }
      }
    }
  return o;
}
int main() {
  at::set_num_threads(1);
  const int KV = 2, H = 4, G = 2, hd = 32, slab = 1024;
  struct C {
    int S, rows, start;
  };
  for (C c : {C{1, 1, 64}, C{1, 1, 300}, C{16, 1, 64}, C{16, 1, 300},
              C{1, 16, 64}, C{1, 16, 300}, C{1, 8, 64}, C{4, 16, 100},
              C{1, 64, 0}, C{1, 256, 256}}) {
    const int S = c.S, rows = c.rows, L = c.start + c.rows;
    const int bk = S * KV;
    at::Tensor keys = at::randn({bk * slab * hd}),
               vals = at::randn({bk * slab * hd});
    at::Tensor kt = keys.as_strided({bk, hd, L}, {slab * hd, 1, hd}, 0);
    at::Tensor v = vals.as_strided({bk, L, hd}, {slab * hd, hd, 1}, 0);
    at::Tensor q = at::randn({S * rows, H, hd});
    // reference path like RunGroup: [S, rows, KV, G, hd] -> [bk, G*rows, hd]
    at::Tensor blocked = at::ones({rows, L}, at::kBool)
                             .triu(c.start + 1)
                             .view({1, 1, 1, rows, L});
    auto a = [&] {
      at::Tensor qs = q.view({S, rows, KV, G, hd})
                          .permute({0, 2, 3, 1, 4})
                          .reshape({bk, G * rows, hd});
      at::Tensor sc = at::bmm(qs, kt);
      if (rows > 1)
        sc.view({S, KV, G, rows, L}).masked_fill_(blocked, -INFINITY);
      at::Tensor o = at::bmm(at::softmax(sc, -1), v);
      return o.view({S, KV, G, rows, hd})
          .permute({0, 3, 1, 2, 4})
          .reshape({S * rows, H * hd});
    };
    auto f = [&] {
      return Fused(q, keys.data_ptr<float>(), vals.data_ptr<float>(), S, rows,
                   c.start, H, KV, hd, slab);
    };
    printf(
        "S=%2d rows=%3d keys=%3d maxdiff %.1e  bmm %7.1f us  fused %7.1f us\n",
        S, rows, L, (a() - f()).abs().max().item<float>(), Us(a, 500),
        Us(f, 500));
  }
}
