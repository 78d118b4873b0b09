#include "common/model/cpu/cpu_panels.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "c10/util/Exception.h"
#include "common/model/cpu/cpu_product_pool.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define DEDIT_PANELS_X86 1
#include "common/model/cpu/cpu_avx2_math.h"
#include "common/model/cpu/cpu_avx512_math.h"
#else
#define DEDIT_PANELS_X86 0
#endif

namespace dedit {
namespace {

std::atomic<CpuProducts> process_products{CpuProducts::kBlas};
std::atomic<CpuIsa> isa_cap{CpuIsa::kAvx512};
std::atomic<int64_t> panel_products{0};

constexpr int64_t kGroup = 16;  // columns per panel: one zmm or two ymm of f32
// Rows and column groups of one AVX-512 register tile: 6 x 4 accumulators,
// 4 weight vectors and a broadcast fit AVX-512's 32 registers.
constexpr int kTileRows = 6;
constexpr int kTileGroups = 4;
// AVX2's 16 registers take one group (two ymm) a tile: f32, 6 rows (12
// accumulators, 2 weight vectors, a broadcast); bf16, 4 rows (8
// accumulators, a k pair's 4 widened weight vectors, a broadcast, the
// odd elements' mask).
constexpr int kAvx2F32TileRows = 6;
constexpr int kAvx2Bf16TileRows = 4;
constexpr int kAvx2TileGroups = 1;
// Weights from which a one-row product is split across the pool's threads:
// 2 MB in bf16, more than a core's L2.
constexpr int64_t kOneRowSplit = int64_t{1} << 20;

// Round to nearest even, as VCVTNE2PS2BF16 does (NaN kept a quiet NaN),
// but keeping denormals, which that instruction flushes to zero: the
// weights' rounding, at Pack (activations take FloatsToBf16).
uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

#if DEDIT_PANELS_X86

// Lanes of group g that hold real columns (the last group may be partial).
DEDIT_AVX512 inline __mmask16 GroupMask(int64_t g, int64_t n) {
  return avx512::LaneMask(n - g * kGroup);
}

// A tile's column masks, and its accumulators from the bias rows (or 0).
template <int R, int C>
DEDIT_AVX512 inline void StartTile(const float* bias, int64_t n, int64_t g0,
                                   __m512 (&acc)[R][C], __mmask16 (&mask)[C]) {
  for (int c = 0; c < C; ++c) mask[c] = GroupMask(g0 + c, n);
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      acc[r][c] = bias == nullptr
                      ? _mm512_setzero_ps()
                      : _mm512_maskz_loadu_ps(mask[c],
                                              bias + r * n + (g0 + c) * kGroup);
    }
  }
}

template <int R, int C>
DEDIT_AVX512 inline void StoreTile(const __m512 (&acc)[R][C],
                                   const __mmask16 (&mask)[C], float* y,
                                   int64_t n, int64_t g0) {
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      _mm512_mask_storeu_ps(y + r * n + (g0 + c) * kGroup, mask[c], acc[r][c]);
    }
  }
}

// Software prefetch of the next register tile's panels into L2 while the
// row blocks of a multi-block product run over the current tile's: then
// the compute of all row blocks overlaps the stream of the next tile from
// DRAM, instead of the first row block waiting on DRAM and the others on
// arithmetic (docs/log/2026-12-06-bench-notebook.md, "The production regime").
// A group's panel is contiguous and a tile's groups follow each other, so the
// next tile is the next byte range; each k step of a tile issues up to
// `per_step` lines of it.
struct Prefetcher {
  const char* next = nullptr;
  const char* end = nullptr;
  int per_step = 0;
  inline void Step() {
    for (int j = 0; j < per_step && next < end; ++j, next += 64) {
      _mm_prefetch(next, _MM_HINT_T1);
    }
  }
};

// R rows x C groups of y from group g0. x: f32 rows (ld k).
template <int R, int C>
DEDIT_AVX512 void F32Tile(const float* x, int64_t k, const float* panels,
                          const float* bias, float* y, int64_t n, int64_t g0,
                          Prefetcher* prefetch) {
  __m512 acc[R][C];
  __mmask16 mask[C];
  StartTile<R, C>(bias, n, g0, acc, mask);
  const float* p = panels + g0 * k * kGroup;
  for (int64_t i = 0; i < k; ++i) {
    prefetch->Step();
    __m512 w[C];
    for (int c = 0; c < C; ++c) {
      w[c] = _mm512_loadu_ps(p + (c * k + i) * kGroup);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * k + i]);
      for (int c = 0; c < C; ++c)
        acc[r][c] = _mm512_fmadd_ps(xv, w[c], acc[r][c]);
    }
  }
  StoreTile<R, C>(acc, mask, y, n, g0);
}

// The same over bf16 pairs: x as [rows][pairs] uint32 (two bf16 each).
template <int R, int C>
DEDIT_AVX512_BF16 void Bf16Tile(const uint32_t* x, int64_t pairs,
                                const uint16_t* panels, const float* bias,
                                float* y, int64_t n, int64_t g0,
                                Prefetcher* prefetch) {
  __m512 acc[R][C];
  __mmask16 mask[C];
  StartTile<R, C>(bias, n, g0, acc, mask);
  const uint16_t* p = panels + g0 * pairs * 2 * kGroup;
  for (int64_t i = 0; i < pairs; ++i) {
    prefetch->Step();
    __m512bh w[C];
    for (int c = 0; c < C; ++c) {
      w[c] = (__m512bh)_mm512_loadu_si512(p + (c * pairs + i) * 2 * kGroup);
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh xv =
          (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * pairs + i]));
      for (int c = 0; c < C; ++c)
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, w[c]);
    }
  }
  StoreTile<R, C>(acc, mask, y, n, g0);
}

// rows<R>(r0) for the last `left` rows from r0, one block, R = left <
// TileRows.
template <int R, typename Rows>
void RemainderBlock(int64_t left, int64_t r0, Rows& rows) {
  if constexpr (R > 0) {
    if (left == R) {
      rows(std::integral_constant<int, R>(), r0);
    } else {
      RemainderBlock<R - 1>(left, r0, rows);
    }
  }
}

// Calls rows<R>(r0) for the row blocks of m: TileRows at a time, then one
// block of the remainder.
template <int TileRows, typename Rows>
void EachRowBlock(int64_t m, Rows rows) {
  int64_t r = 0;
  for (; r + TileRows <= m; r += TileRows) {
    rows(std::integral_constant<int, TileRows>(), r);
  }
  RemainderBlock<TileRows - 1>(m - r, r, rows);
}

// x [n] f32 -> out [n] bf16, rounded by VCVTNE2PS2BF16 (as ToBf16, with
// denormals to zero).
DEDIT_AVX512_BF16 void FloatsToBf16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 2 * kGroup) {
    const int64_t left = std::min<int64_t>(2 * kGroup, n - i);
    const __m512 a = _mm512_maskz_loadu_ps(avx512::LaneMask(left), x + i);
    const __m512 b =
        _mm512_maskz_loadu_ps(avx512::LaneMask(left - kGroup), x + i + kGroup);
    const __mmask32 live =
        left >= 32 ? ~__mmask32{0}
                   : static_cast<__mmask32>((uint32_t{1} << left) - 1);
    _mm512_mask_storeu_epi16(out + i, live, (__m512i)_mm512_cvtne2ps_pbh(b, a));
  }
}

// x [m, k] f32 -> [m, pairs] bf16 pairs, rounded as FloatsToBf16 does; an
// odd k pairs its last element with 0.
void RowsToBf16Pairs(const float* x, int64_t m, int64_t k, int64_t pairs,
                     uint32_t* out) {
  for (int64_t r = 0; r < m; ++r) {
    auto* dst = reinterpret_cast<uint16_t*>(out + r * pairs);
    FloatsToBf16(x + r * k, k, dst);
    if (k % 2 != 0) dst[k] = 0;
  }
}

// Columns [16 * g0, 16 * g1) of all m rows, one register tile's columns
// (TileGroups groups, then single groups) at a time: every row block runs
// over a tile's panels before the next tile starts, so the panels come from
// memory once for all rows and from L2 for the later row blocks (a tile is
// k x 64 weights: 128-384 KB in bf16 at k = 1024-3072). Row block by row
// block over all columns instead re-streamed the whole weight per 6 rows:
// 17 rows cost three passes over a DRAM-resident model. The order of each
// output's sum is the same either way.
template <int TileRows, int TileGroups, typename Tile>
void EachTile(int64_t m, int64_t g0, int64_t g1, const void* panels,
              int64_t group_bytes, Tile tile) {
  const int64_t blocks = (m + TileRows - 1) / TileRows;
  const char* base = static_cast<const char*>(panels);
  // One row block streams its tile as fast as the arithmetic allows, and
  // the hardware prefetcher keeps up with that: the prefetch is for two
  // or more (measured on the wide pair's shapes;
  // docs/log/2026-12-06-bench-notebook.md, "The production regime").
  constexpr int64_t kMinPrefetchBlocks = 2;
  auto run = [&](auto groups, int64_t g) {
    constexpr int C = decltype(groups)::value;
    Prefetcher prefetch;
    if (blocks >= kMinPrefetchBlocks) {
      const int64_t next_groups = std::min<int64_t>(C, g1 - g - C);
      prefetch.next = base + (g + C) * group_bytes;
      prefetch.end =
          prefetch.next + std::max<int64_t>(next_groups, 0) * group_bytes;
      prefetch.per_step = static_cast<int>((C + blocks - 1) / blocks);
    }
    EachRowBlock<TileRows>(
        m, [&](auto rows, int64_t r) { tile(rows, groups, r, g, &prefetch); });
  };
  int64_t g = g0;
  for (; g + TileGroups <= g1; g += TileGroups) {
    run(std::integral_constant<int, TileGroups>(), g);
  }
  for (; g < g1; ++g) run(std::integral_constant<int, 1>(), g);
}

DEDIT_AVX512 void F32Groups(const float* x, int64_t m, int64_t k,
                            const float* panels, const float* bias, float* y,
                            int64_t n, int64_t g0, int64_t g1) {
  EachTile<kTileRows, kTileGroups>(
      m, g0, g1, panels, k * kGroup * sizeof(float),
      [&](auto rows, auto groups, int64_t r, int64_t g, Prefetcher* pf) {
        F32Tile<decltype(rows)::value, decltype(groups)::value>(
            x + r * k, k, panels, bias == nullptr ? nullptr : bias + r * n,
            y + r * n, n, g, pf);
      });
}

DEDIT_AVX512_BF16 void Bf16Groups(const uint32_t* x, int64_t m, int64_t pairs,
                                  const uint16_t* panels, const float* bias,
                                  float* y, int64_t n, int64_t g0, int64_t g1) {
  EachTile<kTileRows, kTileGroups>(
      m, g0, g1, panels, pairs * 2 * kGroup * sizeof(uint16_t),
      [&](auto rows, auto groups, int64_t r, int64_t g, Prefetcher* pf) {
        Bf16Tile<decltype(rows)::value, decltype(groups)::value>(
            x + r * pairs, pairs, panels,
            bias == nullptr ? nullptr : bias + r * n, y + r * n, n, g, pf);
      });
}

DEDIT_AVX512 void SiluMulRows(const float* gu, int64_t n, int64_t inter,
                              float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* g = gu + r * 2 * inter;
    const float* u = g + inter;
    float* y = out + r * inter;
    for (int64_t j = 0; j < inter; j += kGroup) {
      const int64_t left = std::min(kGroup, inter - j);
      const __mmask16 live = avx512::LaneMask(left);
      const __m512 gv = _mm512_maskz_loadu_ps(live, g + j);
      const __m512 uv = _mm512_maskz_loadu_ps(live, u + j);
      const __m512 e = avx512::Exp(_mm512_sub_ps(_mm512_setzero_ps(), gv));
      const __m512 silu =
          _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
      _mm512_mask_storeu_ps(y + j, live, _mm512_mul_ps(silu, uv));
    }
  }
}

DEDIT_AVX512 void ArgmaxConfidenceRows(const float* logits, int64_t n,
                                       int64_t vocab, int64_t* argmax,
                                       float* confidence) {
  const __m512i lane =
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t r = 0; r < n; ++r) {
    const float* l = logits + r * vocab;
    // Each lane keeps its largest value and the first index holding it.
    __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512i at = _mm512_setzero_si512();
    for (int64_t j = 0; j < vocab; j += kGroup) {
      const __mmask16 live = avx512::LaneMask(vocab - j);
      const __m512 v = _mm512_mask_loadu_ps(best, live, l + j);
      const __mmask16 more = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
      best = _mm512_mask_mov_ps(best, more, v);
      at = _mm512_mask_mov_epi32(
          at, more,
          _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int32_t>(j))));
    }
    const float top = _mm512_reduce_max_ps(best);
    const __mmask16 tops =
        _mm512_cmp_ps_mask(best, _mm512_set1_ps(top), _CMP_EQ_OQ);
    argmax[r] = _mm512_mask_reduce_min_epi32(tops, at);
    const __m512 m = _mm512_set1_ps(top);
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < vocab; j += kGroup) {
      const __mmask16 live = avx512::LaneMask(vocab - j);
      const __m512 v = _mm512_maskz_loadu_ps(live, l + j);
      total = _mm512_add_ps(
          total, _mm512_maskz_mov_ps(live, avx512::Exp(_mm512_sub_ps(v, m))));
    }
    confidence[r] = 1.0f / _mm512_reduce_add_ps(total);
  }
}

// The AVX2 family: the kernels above on 8-lane ymm, a 16-column group as
// two. Each output is summed as its AVX-512 twin sums it (f32: bias, then
// one FMA per k in order; bf16: per k pair the odd product, then the even
// one), so the invariant of cpu_panels.h holds the same way.

// The lanes of half h (0 or 1) of group g that hold real columns: 8, or
// fewer (0 or less: none) in the last group.
inline int64_t HalfLanes(int64_t g, int h, int64_t n) {
  return n - g * kGroup - h * avx2::kLanes;
}

template <int R, int C>
DEDIT_AVX2 inline void StartTileAvx2(const float* bias, int64_t n, int64_t g0,
                                     __m256 (&acc)[R][C][2]) {
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      for (int h = 0; h < 2; ++h) {
        acc[r][c][h] =
            bias == nullptr
                ? _mm256_setzero_ps()
                : avx2::LoadFirst(bias + r * n + (g0 + c) * kGroup + h * 8,
                                  HalfLanes(g0 + c, h, n));
      }
    }
  }
}

template <int R, int C>
DEDIT_AVX2 inline void StoreTileAvx2(const __m256 (&acc)[R][C][2], float* y,
                                     int64_t n, int64_t g0) {
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      for (int h = 0; h < 2; ++h) {
        const int64_t lanes = HalfLanes(g0 + c, h, n);
        if (lanes > 0) {
          avx2::StoreFirst(y + r * n + (g0 + c) * kGroup + h * 8, lanes,
                           acc[r][c][h]);
        }
      }
    }
  }
}

// F32Tile on AVX2.
template <int R, int C>
DEDIT_AVX2 void F32TileAvx2(const float* x, int64_t k, const float* panels,
                            const float* bias, float* y, int64_t n, int64_t g0,
                            Prefetcher* prefetch) {
  __m256 acc[R][C][2];
  StartTileAvx2<R, C>(bias, n, g0, acc);
  const float* p = panels + g0 * k * kGroup;
  for (int64_t i = 0; i < k; ++i) {
    prefetch->Step();
    __m256 w[C][2];
    for (int c = 0; c < C; ++c) {
      for (int h = 0; h < 2; ++h) {
        w[c][h] = _mm256_loadu_ps(p + (c * k + i) * kGroup + h * 8);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * k + i);
      for (int c = 0; c < C; ++c) {
        for (int h = 0; h < 2; ++h) {
          acc[r][c][h] = _mm256_fmadd_ps(xv, w[c][h], acc[r][c][h]);
        }
      }
    }
  }
  StoreTileAvx2<R, C>(acc, y, n, g0);
}

// Bf16Tile on AVX2: x as rows of 2 * pairs f32 values already rounded to
// bf16 (RoundedRowsAvx2), each weight pair widened to f32 (exact) and
// summed as VDPBF16PS defines: acc += odd product, then += even product,
// each product exact in f32 and rounded once by its FMA.
template <int R, int C>
DEDIT_AVX2 void Bf16TileAvx2(const float* x, int64_t pairs,
                             const uint16_t* panels, const float* bias,
                             float* y, int64_t n, int64_t g0,
                             Prefetcher* prefetch) {
  __m256 acc[R][C][2];
  StartTileAvx2<R, C>(bias, n, g0, acc);
  const uint16_t* p = panels + g0 * pairs * 2 * kGroup;
  for (int64_t i = 0; i < pairs; ++i) {
    prefetch->Step();
    __m256 even[C][2], odd[C][2];
    for (int c = 0; c < C; ++c) {
      for (int h = 0; h < 2; ++h) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
            p + (c * pairs + i) * 2 * kGroup + h * 16));
        even[c][h] = avx2::EvenBf16(w);
        odd[c][h] = avx2::OddBf16(w);
      }
    }
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * 2 * pairs + 2 * i;
      const __m256 xo = _mm256_broadcast_ss(xr + 1);
      for (int c = 0; c < C; ++c) {
        for (int h = 0; h < 2; ++h) {
          acc[r][c][h] = _mm256_fmadd_ps(xo, odd[c][h], acc[r][c][h]);
        }
      }
      const __m256 xe = _mm256_broadcast_ss(xr);
      for (int c = 0; c < C; ++c) {
        for (int h = 0; h < 2; ++h) {
          acc[r][c][h] = _mm256_fmadd_ps(xe, even[c][h], acc[r][c][h]);
        }
      }
    }
  }
  StoreTileAvx2<R, C>(acc, y, n, g0);
}

DEDIT_AVX2 void F32GroupsAvx2(const float* x, int64_t m, int64_t k,
                              const float* panels, const float* bias, float* y,
                              int64_t n, int64_t g0, int64_t g1) {
  EachTile<kAvx2F32TileRows, kAvx2TileGroups>(
      m, g0, g1, panels, k * kGroup * sizeof(float),
      [&](auto rows, auto groups, int64_t r, int64_t g, Prefetcher* pf) {
        F32TileAvx2<decltype(rows)::value, decltype(groups)::value>(
            x + r * k, k, panels, bias == nullptr ? nullptr : bias + r * n,
            y + r * n, n, g, pf);
      });
}

DEDIT_AVX2 void Bf16GroupsAvx2(const float* x, int64_t m, int64_t pairs,
                               const uint16_t* panels, const float* bias,
                               float* y, int64_t n, int64_t g0, int64_t g1) {
  EachTile<kAvx2Bf16TileRows, kAvx2TileGroups>(
      m, g0, g1, panels, pairs * 2 * kGroup * sizeof(uint16_t),
      [&](auto rows, auto groups, int64_t r, int64_t g, Prefetcher* pf) {
        Bf16TileAvx2<decltype(rows)::value, decltype(groups)::value>(
            x + r * 2 * pairs, pairs, panels,
            bias == nullptr ? nullptr : bias + r * n, y + r * n, n, g, pf);
      });
}

// 16 floats -> 16 bf16, rounded as FloatsToBf16.
DEDIT_AVX2 inline void SixteenToBf16Avx2(const float* x, uint16_t* out) {
  const __m256i a = _mm256_srli_epi32(
      avx2::RoundToBf16(_mm256_castps_si256(_mm256_loadu_ps(x))), 16);
  const __m256i b = _mm256_srli_epi32(
      avx2::RoundToBf16(_mm256_castps_si256(_mm256_loadu_ps(x + 8))), 16);
  // packus interleaves the 128-bit halves of a and b; the permute puts
  // them back in order.
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(out),
      _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8));
}

// FloatsToBf16 on AVX2, to the same bits.
DEDIT_AVX2 void FloatsToBf16Avx2(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + kGroup <= n; i += kGroup) SixteenToBf16Avx2(x + i, out + i);
  if (i == n) return;
  float tail[kGroup] = {};
  uint16_t bits[kGroup];
  std::memcpy(tail, x + i, (n - i) * sizeof(float));
  SixteenToBf16Avx2(tail, bits);
  std::memcpy(out + i, bits, (n - i) * sizeof(uint16_t));
}

// x [m, k] -> [m, 2 * pairs] f32, each rounded to bf16 as FloatsToBf16
// rounds (the operands of Bf16TileAvx2); an odd k's last pair ends in 0.
DEDIT_AVX2 void RoundedRowsAvx2(const float* x, int64_t m, int64_t k,
                                int64_t pairs, float* out) {
  for (int64_t r = 0; r < m; ++r) {
    float* dst = out + r * 2 * pairs;
    for (int64_t j = 0; j < k; j += avx2::kLanes) {
      const __m256i u =
          _mm256_castps_si256(avx2::LoadFirst(x + r * k + j, k - j));
      avx2::StoreFirst(dst + j, k - j,
                       _mm256_castsi256_ps(avx2::RoundToBf16(u)));
    }
    if (k % 2 != 0) dst[k] = 0.0f;
  }
}

DEDIT_AVX2 void SiluMulRowsAvx2(const float* gu, int64_t n, int64_t inter,
                                float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* g = gu + r * 2 * inter;
    const float* u = g + inter;
    float* y = out + r * inter;
    for (int64_t j = 0; j < inter; j += avx2::kLanes) {
      const int64_t left = inter - j;
      const __m256 gv = avx2::LoadFirst(g + j, left);
      const __m256 uv = avx2::LoadFirst(u + j, left);
      const __m256 e = avx2::Exp(_mm256_sub_ps(_mm256_setzero_ps(), gv));
      const __m256 silu =
          _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
      avx2::StoreFirst(y + j, left, _mm256_mul_ps(silu, uv));
    }
  }
}

// The least of v's 8 lanes.
DEDIT_AVX2 inline int32_t ReduceMinEpi32(__m256i v) {
  __m128i s =
      _mm_min_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_min_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_min_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

DEDIT_AVX2 void ArgmaxConfidenceRowsAvx2(const float* logits, int64_t n,
                                         int64_t vocab, int64_t* argmax,
                                         float* confidence) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t r = 0; r < n; ++r) {
    const float* l = logits + r * vocab;
    // Each lane keeps its largest value and the first index holding it;
    // lanes past the row keep theirs.
    __m256 best = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    __m256i at = _mm256_setzero_si256();
    for (int64_t j = 0; j < vocab; j += avx2::kLanes) {
      const int64_t left = vocab - j;
      const __m256 v =
          left >= avx2::kLanes
              ? _mm256_loadu_ps(l + j)
              : _mm256_blendv_ps(best, avx2::LoadFirst(l + j, left),
                                 _mm256_castsi256_ps(avx2::LaneMask(left)));
      const __m256 more = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
      best = _mm256_blendv_ps(best, v, more);
      at = _mm256_blendv_epi8(
          at,
          _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int32_t>(j))),
          _mm256_castps_si256(more));
    }
    const float top = avx2::ReduceMax(best);
    const __m256 tops = _mm256_cmp_ps(best, _mm256_set1_ps(top), _CMP_EQ_OQ);
    argmax[r] = ReduceMinEpi32(_mm256_blendv_epi8(
        _mm256_set1_epi32(std::numeric_limits<int32_t>::max()), at,
        _mm256_castps_si256(tops)));
    const __m256 m = _mm256_set1_ps(top);
    __m256 total = _mm256_setzero_ps();
    for (int64_t j = 0; j < vocab; j += avx2::kLanes) {
      const int64_t left = vocab - j;
      const __m256 e =
          avx2::Exp(_mm256_sub_ps(avx2::LoadFirst(l + j, left), m));
      total = _mm256_add_ps(
          total, _mm256_and_ps(e, _mm256_castsi256_ps(avx2::LaneMask(left))));
    }
    confidence[r] = 1.0f / avx2::ReduceAdd(total);
  }
}

#endif  // DEDIT_PANELS_X86

}  // namespace

void CpuArgmaxConfidence(const float* logits, int64_t n, int64_t vocab,
                         int64_t* argmax, float* confidence) {
#if DEDIT_PANELS_X86
  if (CpuIsaOf(CpuProducts::kF32) == CpuIsa::kAvx512) {
    ArgmaxConfidenceRows(logits, n, vocab, argmax, confidence);
  } else {
    ArgmaxConfidenceRowsAvx2(logits, n, vocab, argmax, confidence);
  }
#else
  (void)logits, (void)n, (void)vocab, (void)argmax, (void)confidence;
#endif
}

void CpuFloatsToBf16(const float* x, int64_t n, uint16_t* out) {
#if DEDIT_PANELS_X86
  if (CpuIsaOf(CpuProducts::kBf16) == CpuIsa::kAvx512) {
    FloatsToBf16(x, n, out);
  } else {
    FloatsToBf16Avx2(x, n, out);
  }
#else
  (void)x, (void)n, (void)out;
#endif
}

void PanelSiluMul(const float* gu, int64_t n, int64_t inter, float* out) {
#if DEDIT_PANELS_X86
  if (CpuIsaOf(CpuProducts::kF32) == CpuIsa::kAvx512) {
    SiluMulRows(gu, n, inter, out);
  } else {
    SiluMulRowsAvx2(gu, n, inter, out);
  }
#else
  (void)gu, (void)n, (void)inter, (void)out;
#endif
}

std::string_view CpuProductsName(CpuProducts kind) {
  switch (kind) {
    case CpuProducts::kBlas:
      return "blas";
    case CpuProducts::kF32:
      return "f32";
    case CpuProducts::kBf16:
      return "bf16";
  }
  return "?";
}

bool CpuRuns(CpuProducts kind) {
  return kind == CpuProducts::kBlas || CpuIsaOf(kind) != CpuIsa::kNone;
}

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kNone:
      return "none";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

CpuIsa CpuIsaOf(CpuProducts kind) {
  if (kind == CpuProducts::kBlas) return CpuIsa::kNone;
#if DEDIT_PANELS_X86
  static const bool avx512 = __builtin_cpu_supports("avx512f") &&
                             __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl");
  static const bool avx512_bf16 =
      avx512 && __builtin_cpu_supports("avx512bf16");
  static const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const CpuIsa cap = isa_cap.load(std::memory_order_relaxed);
  if (cap >= CpuIsa::kAvx512 &&
      (kind == CpuProducts::kF32 ? avx512 : avx512_bf16)) {
    return CpuIsa::kAvx512;
  }
  if (cap >= CpuIsa::kAvx2 && avx2) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kNone;
}

void SetCpuIsaCapForTesting(CpuIsa cap) { isa_cap.store(cap); }

void SetCpuProducts(CpuProducts kind) { process_products.store(kind); }
CpuProducts GetCpuProducts() { return process_products.load(); }

CpuProducts BestCpuProducts() {
  for (CpuProducts kind : {CpuProducts::kBf16, CpuProducts::kF32}) {
    if (CpuRuns(kind)) return kind;
  }
  return CpuProducts::kBlas;
}

absl::Status SetCpuProductsFlag(std::string_view name, std::string_view flag) {
  if (name == "auto") {
    SetCpuProducts(BestCpuProducts());
    return absl::OkStatus();
  }
  for (CpuProducts kind :
       {CpuProducts::kBlas, CpuProducts::kF32, CpuProducts::kBf16}) {
    if (name != CpuProductsName(kind)) continue;
    if (!CpuRuns(kind)) {
      return absl::FailedPreconditionError(
          absl::StrCat(std::string(flag), "=", std::string(name),
                       ": this CPU lacks the instructions (AVX2 and FMA, or "
                       "AVX-512)"));
    }
    SetCpuProducts(kind);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(flag), " must be auto, blas, f32 or bf16, got \"",
      std::string(name), "\""));
}

CpuPanels::CpuPanels(CpuProducts kind, int64_t k, int64_t n)
    : kind_(kind),
      k_(k),
      n_(n),
      groups_((n + kGroup - 1) / kGroup),
      pairs_((k + 1) / 2) {}

std::shared_ptr<const CpuPanels> CpuPanels::Pack(const at::Tensor& w,
                                                 CpuProducts kind) {
  if (kind == CpuProducts::kBlas || !CpuRuns(kind) || !w.defined() ||
      w.dim() != 2 || !w.device().is_cpu() || w.scalar_type() != at::kFloat ||
      !w.is_contiguous() || w.size(0) == 0 || w.size(1) == 0) {
    return nullptr;
  }
  const int64_t k = w.size(0), n = w.size(1);
  std::shared_ptr<CpuPanels> p(new CpuPanels(kind, k, n));
  const float* src = w.data_ptr<float>();
  auto at = [&](int64_t row, int64_t col) {
    return row < k && col < n ? src[row * n + col] : 0.0f;
  };
  if (kind == CpuProducts::kF32) {
    p->f32_ = LargeArray<float>(p->groups_ * k * kGroup);
    if (p->f32_.data() == nullptr) return nullptr;
    for (int64_t g = 0; g < p->groups_; ++g) {
      for (int64_t i = 0; i < k; ++i) {
        for (int64_t c = 0; c < kGroup; ++c) {
          p->f32_[(g * k + i) * kGroup + c] = at(i, g * kGroup + c);
        }
      }
    }
  } else {
    p->bf16_ = LargeArray<uint16_t>(p->groups_ * p->pairs_ * 2 * kGroup);
    if (p->bf16_.data() == nullptr) return nullptr;
    for (int64_t g = 0; g < p->groups_; ++g) {
      for (int64_t i = 0; i < p->pairs_; ++i) {
        for (int64_t c = 0; c < kGroup; ++c) {
          for (int64_t e = 0; e < 2; ++e) {
            p->bf16_[((g * p->pairs_ + i) * kGroup + c) * 2 + e] =
                ToBf16(at(2 * i + e, g * kGroup + c));
          }
        }
      }
    }
  }
  return p;
}

std::shared_ptr<const CpuPanels> CpuPanels::PackForThisProcess(
    const at::Tensor& w) {
  return Pack(w, GetCpuProducts());
}

int64_t CpuPanels::products_run() { return panel_products.load(); }

int64_t CpuPanels::bytes() const {
  return static_cast<int64_t>(f32_.size() * sizeof(float) +
                              bf16_.size() * sizeof(uint16_t));
}

void CpuPanels::MultiplyGroups(CpuIsa isa, const float* x, const void* rounded,
                               int64_t m, const float* bias, float* y,
                               int64_t g0, int64_t g1) const {
#if DEDIT_PANELS_X86
  if (g0 >= g1) return;
  const bool avx512 = isa == CpuIsa::kAvx512;
  if (kind_ == CpuProducts::kF32) {
    (avx512 ? F32Groups : F32GroupsAvx2)(x, m, k_, f32_.data(), bias, y, n_, g0,
                                         g1);
  } else if (avx512) {
    Bf16Groups(static_cast<const uint32_t*>(rounded), m, pairs_, bf16_.data(),
               bias, y, n_, g0, g1);
  } else {
    Bf16GroupsAvx2(static_cast<const float*>(rounded), m, pairs_, bf16_.data(),
                   bias, y, n_, g0, g1);
  }
#else
  (void)isa, (void)x, (void)rounded, (void)m, (void)bias, (void)y, (void)g0;
  (void)g1;
#endif
}

void CpuPanels::Multiply(const float* x, int64_t m, const float* bias, float* y,
                         CpuProductPool* pool) const {
  if (m <= 0) return;
  panel_products.fetch_add(1, std::memory_order_relaxed);
  // One ISA for the whole product (the cap is read once).
  const CpuIsa isa = CpuIsaOf(kind_);
  TORCH_CHECK(isa != CpuIsa::kNone,
              "CpuPanels::Multiply: this CPU no longer runs the panels' "
              "kernel (SetCpuIsaCapForTesting)");
  // The activation rows rounded to bf16, once for all threads: AVX-512's
  // as bf16 pairs, AVX2's as f32. A thread's buffers, kept between calls:
  // products run on model threads only.
  thread_local std::vector<uint32_t> pairs;
  thread_local std::vector<float> rounded_rows;
  const void* p = nullptr;
#if DEDIT_PANELS_X86
  if (kind_ == CpuProducts::kBf16 && isa == CpuIsa::kAvx512) {
    pairs.resize(static_cast<size_t>(m * pairs_));
    RowsToBf16Pairs(x, m, k_, pairs_, pairs.data());
    p = pairs.data();
  } else if (kind_ == CpuProducts::kBf16) {
    rounded_rows.resize(static_cast<size_t>(m * 2 * pairs_));
    RoundedRowsAvx2(x, m, k_, pairs_, rounded_rows.data());
    p = rounded_rows.data();
  }
#endif
  // Parts of whole register tiles (kTileGroups groups: one AVX-512 tile,
  // four AVX2 ones), so a split costs no narrower tiles. One
  // row splits only over a weight past a core's L2: there a decode step
  // streams the weight from DRAM, and one core alone does not reach the
  // machine's DRAM rate (docs/log/2026-12-06-bench-notebook.md, "The production
  // regime"). A small weight's one-row product takes a few microseconds, and
  // handing half of it to a helper made a decode step slower.
  const bool split = pool != nullptr && (m >= 2 || k_ * n_ >= kOneRowSplit);
  const int parts = split ? pool->threads() : 1;
  const int64_t tiles = (groups_ + kTileGroups - 1) / kTileGroups;
  if (parts <= 1 || tiles < 2) {
    MultiplyGroups(isa, x, p, m, bias, y, 0, groups_);
    return;
  }
  const int64_t per = (tiles + parts - 1) / parts * kTileGroups;
  pool->Run(parts, [&](int part) {
    MultiplyGroups(isa, x, p, m, bias, y, std::min(groups_, part * per),
                   std::min(groups_, (part + 1) * per));
  });
}

}  // namespace dedit
