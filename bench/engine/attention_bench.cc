// dedit-attention-bench: CpuAttention (common/model/cpu/cpu_attention.h, the
// row attention of --cpu_products f32|bf16) on the target's shapes: a decode
// step (1 row), a verify block (W + 1 rows of one sequence) and a batched
// decode step (one row of each of S sequences), for a number of cached
// keys (docs/log/2026-12-06-bench-notebook.md, "Weight panels and row
// attention"). One JSON object per shape: median µs per call (all layers' worth
// is --layers times that) and ns per (row, head). With --dump FILE, the outputs
// of every shape (seeded inputs) are written to FILE, so that two builds'
// kernels can be compared to the bit. Built with the tests, never run by ctest.
// --layers 12 --slab 256 reads K/V as a forward of the target does: each call
// another layer's, in slabs of the pool's size.
//
// --kv_dtype bf16 runs CpuAttentionBf16 over bf16 K/V (--kv_cache_dtype
// bf16).
//
//   build/bench/engine/dedit-attention-bench [--keys 96] [--dump FILE]
//       [--layers 1] [--slab 0] [--kv_dtype f32]
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/engine/micro_timing.h"
#include "common/model/cpu/cpu_attention.h"
#include "common/model/cpu/cpu_product_pool.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, keys, 96, "cached keys of each sequence before its rows");
ABSL_FLAG(int, heads, 4, "query heads");
ABSL_FLAG(int, kv_heads, 2, "kv heads");
ABSL_FLAG(int, head_dim, 32, "head size");
ABSL_FLAG(int, product_threads, 1, "threads (CpuProductPool)");
ABSL_FLAG(std::string, dump, "", "write every shape's output here");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "K/V element type: f32 (CpuAttention) or bf16 (CpuAttentionBf16)");
ABSL_FLAG(int, layers, 1,
          "layers of K/V, each call attends the next one's: 12 makes the "
          "K/V a call reads as cold as in a forward of the target");
ABSL_FLAG(int, slab, 0,
          "positions per slot (the KvPool's slab, 256 at least there); 0: "
          "the keys and rows only");

namespace dedit {
namespace {

struct Shape {
  const char* name;
  int sequences;  // slots
  int rows;       // query rows per sequence, causal after the cached keys
};

int Main() {
  at::NoGradGuard no_grad;
  const std::string kv_dtype = absl::GetFlag(FLAGS_kv_dtype);
  const bool bf16 = kv_dtype == "bf16";
  if (!bf16 && kv_dtype != "f32") {
    std::fprintf(stderr, "dedit-attention-bench: --kv_dtype f32 or bf16\n");
    return 2;
  }
  if (!(bf16 ? CpuAttentionBf16Runs(absl::GetFlag(FLAGS_head_dim))
             : CpuAttentionRuns(absl::GetFlag(FLAGS_head_dim)))) {
    std::fprintf(stderr,
                 "dedit-attention-bench: CpuAttention does not run "
                 "on this CPU for this head size\n");
    return 2;
  }
  if (absl::Status s =
          SetCpuProductThreadsFlag(absl::GetFlag(FLAGS_product_threads));
      !s.ok()) {
    std::fprintf(stderr, "dedit-attention-bench: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  const int heads = absl::GetFlag(FLAGS_heads);
  const int kv_heads = absl::GetFlag(FLAGS_kv_heads);
  const int64_t hd = absl::GetFlag(FLAGS_head_dim);
  const int64_t keys = absl::GetFlag(FLAGS_keys);
  std::ofstream dump;
  if (!absl::GetFlag(FLAGS_dump).empty()) {
    dump.open(absl::GetFlag(FLAGS_dump), std::ios::binary);
  }
  const Shape shapes[] = {{"decode", 1, 1},    {"verify9", 1, 9},
                          {"verify17", 1, 17}, {"batch16", 16, 1},
                          {"batch64", 64, 1},  {"batch16_verify9", 16, 9}};
  for (const Shape& shape : shapes) {
    at::manual_seed(7);
    int64_t slab =
        std::max<int64_t>(keys + shape.rows, absl::GetFlag(FLAGS_slab));
    // The bf16 kernel reads keys in whole blocks of 16 positions: its pool's
    // slabs are whole blocks (common/model/kv_pool.h).
    if (bf16) slab = (slab + kBf16KeyBlock - 1) / kBf16KeyBlock * kBf16KeyBlock;
    const int64_t n = int64_t{shape.sequences} * shape.rows;
    const int layers = std::max(1, absl::GetFlag(FLAGS_layers));
    const at::ScalarType dtype = bf16 ? at::kBFloat16 : at::kFloat;
    const at::Tensor k =
        at::randn({layers, shape.sequences, kv_heads, slab, hd}).to(dtype);
    const at::Tensor v = at::randn_like(k);
    const int64_t layer_floats = k.numel() / layers;
    const at::Tensor q = at::randn({n, heads * hd}) * (1.0 / std::sqrt(hd));
    at::Tensor out = at::empty({n, heads * hd});
    std::vector<int32_t> slot;
    std::vector<int64_t> visible;
    for (int s = 0; s < shape.sequences; ++s) {
      for (int r = 0; r < shape.rows; ++r) {
        slot.push_back(s);
        visible.push_back(keys + r + 1);
      }
    }
    CpuAttentionRows rows;
    rows.n = n;
    rows.slot = slot.data();
    rows.visible = visible.data();
    int layer = 0;
    auto call = [&] {
      const int64_t at = layer * layer_floats;
      if (bf16) {
        CpuAttentionBf16(
            q.data_ptr<float>(), q.stride(0), rows, heads, kv_heads, hd,
            static_cast<const uint16_t*>(k.data_ptr()) + at,
            static_cast<const uint16_t*>(v.data_ptr()) + at, slab,
            out.data_ptr<float>(), CpuProductPool::ForThisThread());
      } else {
        CpuAttention(q.data_ptr<float>(), q.stride(0), rows, heads, kv_heads,
                     hd, k.data_ptr<float>() + at, v.data_ptr<float>() + at,
                     slab, out.data_ptr<float>(),
                     CpuProductPool::ForThisThread());
      }
      layer = (layer + 1) % layers;
    };
    const double us = bench::MedianUs(call, 200, 20, 7);
    if (dump.is_open()) {
      layer = 0;
      call();
      dump.write(reinterpret_cast<const char*>(out.data_ptr<float>()),
                 out.numel() * sizeof(float));
    }
    nlohmann::json j = {{"shape", shape.name},
                        {"sequences", shape.sequences},
                        {"rows_per_sequence", shape.rows},
                        {"keys", keys},
                        {"layers", layers},
                        {"kv_dtype", kv_dtype},
                        {"slab", slab},
                        {"us", us},
                        {"ns_per_row_head", 1000 * us / (n * heads)}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace dedit

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return dedit::Main();
}
