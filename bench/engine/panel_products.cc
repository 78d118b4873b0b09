// dedit-panel-bench: the weight products of one forward of the production
// target (12 layers' qkv, o, gate/up and down, distinct weights per layer
// as in a real forward, and the 128 x 2048 head: 49 products) through
// CpuMm / CpuAddmm on each --cpu_products kernel
// (docs/log/2026-12-06-bench-notebook.md, "Weight panels and row attention").
// One JSON object per row count: median µs of the 49 products per kernel and
// the ratios to blas. Built with the tests, never run by ctest.
//
//   build/bench/engine/dedit-panel-bench [--rows 1,2,4,9,16,32,64]
//       [--product_threads 1]
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/engine/micro_timing.h"
#include "common/model/cpu/cpu_kernels.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/cpu/cpu_product_pool.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, rows, "1,2,4,9,16,32,64", "product rows to time");
ABSL_FLAG(int, product_threads, 1, "threads per product (CpuProductPool)");
ABSL_FLAG(int, layers, 12, "decoder layers");
ABSL_FLAG(int, hidden, 128, "hidden size");
ABSL_FLAG(int, intermediate, 384, "MLP width");
ABSL_FLAG(int, qkv, 256, "q + k + v width");
ABSL_FLAG(int, vocab, 2048, "output head rows");

namespace dedit {
namespace {

struct Product {
  at::Tensor w;                                // [k, n]
  std::shared_ptr<const CpuPanels> panels[3];  // by CpuProducts
  bool residual = false;                       // CpuAddmm
};

int Main() {
  at::NoGradGuard no_grad;
  at::manual_seed(1);
  if (absl::Status s =
          SetCpuProductThreadsFlag(absl::GetFlag(FLAGS_product_threads));
      !s.ok()) {
    std::fprintf(stderr, "dedit-panel-bench: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  const int64_t h = absl::GetFlag(FLAGS_hidden);
  const int64_t inter = absl::GetFlag(FLAGS_intermediate);
  std::vector<Product> products;
  auto add = [&](int64_t k, int64_t n, bool residual) {
    Product p;
    p.w = at::randn({k, n}) * 0.05;
    p.residual = residual;
    for (CpuProducts kind : {CpuProducts::kF32, CpuProducts::kBf16}) {
      p.panels[static_cast<int>(kind)] = CpuPanels::Pack(p.w, kind);
    }
    products.push_back(std::move(p));
  };
  for (int l = 0; l < absl::GetFlag(FLAGS_layers); ++l) {
    add(h, absl::GetFlag(FLAGS_qkv), false);
    add(absl::GetFlag(FLAGS_qkv) / 2, h, true);  // o_proj: heads * hd rows
    add(h, 2 * inter, false);
    add(inter, h, true);
  }
  add(h, absl::GetFlag(FLAGS_vocab), false);
  std::vector<int64_t> row_counts;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_rows), ',')) {
    int64_t r = 0;
    if (!absl::SimpleAtoi(part, &r) || r < 1) {
      std::fprintf(stderr, "dedit-panel-bench: bad --rows\n");
      return 2;
    }
    row_counts.push_back(r);
  }
  for (int64_t m : row_counts) {
    nlohmann::json out = {{"rows", m},
                          {"products", products.size()},
                          {"product_threads", CpuProductThreads()}};
    std::vector<at::Tensor> xs, residuals;
    for (const Product& p : products) {
      xs.push_back(at::randn({m, p.w.size(0)}));
      residuals.push_back(at::randn({m, p.w.size(1)}));
    }
    double blas_us = 0;
    for (CpuProducts kind :
         {CpuProducts::kBlas, CpuProducts::kF32, CpuProducts::kBf16}) {
      if (!CpuRuns(kind)) continue;
      const int k = static_cast<int>(kind);
      auto forward = [&] {
        for (size_t i = 0; i < products.size(); ++i) {
          const Product& p = products[i];
          const CpuPanels* panels = p.panels[k].get();
          if (p.residual) {
            CpuAddmm(residuals[i], xs[i], p.w, panels);
          } else {
            CpuMm(xs[i], p.w, panels);
          }
        }
      };
      const double us =
          bench::MedianUs(forward, std::max<int>(5, 400 / m), 20, 7);
      const std::string name(CpuProductsName(kind));
      out[name + "_us"] = us;
      if (kind == CpuProducts::kBlas) {
        blas_us = us;
      } else if (blas_us > 0) {
        out[name + "_speedup"] = blas_us / us;
      }
    }
    std::printf("%s\n", out.dump().c_str());
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
