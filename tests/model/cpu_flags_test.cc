// The CPU kernel flags (common/model/cpu/cpu_flags.h): --threads N alone sets
// every compute thread of a process, the product pool included, and libtorch's
// intra-op threads step aside where the pool does the work.
#include "common/model/cpu/cpu_flags.h"

#include <ATen/Parallel.h>

#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/cpu/cpu_product_pool.h"
#include "common/model/cpu/cpu_threads.h"
#include "gtest/gtest.h"

namespace dedit {
namespace {

class CpuFlagsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    absl::SetFlag(&FLAGS_product_threads, 0);
    absl::SetFlag(&FLAGS_cpu_products, "auto");
    SetCpuProductThreads(1);
    SetCpuProducts(CpuProducts::kBlas);
    SetCpuThreads(1);
  }
};

TEST_F(CpuFlagsTest, ThreadsAloneSetsTheProductPool) {
  ASSERT_TRUE(ApplyCpuKernelFlags(3).ok());
  EXPECT_EQ(CpuProductThreads(), 3);
  if (CpuRuns(CpuProducts::kF32)) {
    // Products on panels: the pool works, libtorch's threads would spin.
    EXPECT_NE(GetCpuProducts(), CpuProducts::kBlas);
    EXPECT_EQ(at::get_num_threads(), 1);
  }
  // 0: the machine's cores.
  ASSERT_TRUE(ApplyCpuKernelFlags(0).ok());
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(ProcessComputeThreads(0), cores > 0 ? cores : 1);
  EXPECT_EQ(CpuProductThreads(),
            std::min(ProcessComputeThreads(0), kMaxCpuProductThreads));
}

TEST_F(CpuFlagsTest, ExplicitProductThreadsAndBlasKeepLibtorchThreads) {
  absl::SetFlag(&FLAGS_product_threads, 1);
  ASSERT_TRUE(ApplyCpuKernelFlags(3).ok());
  EXPECT_EQ(CpuProductThreads(), 1);
  EXPECT_EQ(at::get_num_threads(), 3);  // no pool: libtorch takes the cores
  absl::SetFlag(&FLAGS_product_threads, 0);
  absl::SetFlag(&FLAGS_cpu_products, "blas");
  ASSERT_TRUE(ApplyCpuKernelFlags(3).ok());
  EXPECT_EQ(GetCpuProducts(), CpuProducts::kBlas);
  EXPECT_EQ(CpuProductThreads(), 3);
  EXPECT_EQ(at::get_num_threads(), 3);  // blas products are libtorch's
  EXPECT_EQ(LibtorchThreadsFor(3), 3);
}

TEST_F(CpuFlagsTest, BadCountsNameTheirFlag) {
  const absl::Status threads = ApplyCpuKernelFlags(-1);
  EXPECT_EQ(threads.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(threads.message()).find("--threads"),
            std::string::npos);
  absl::SetFlag(&FLAGS_product_threads, -2);
  const absl::Status product = ApplyCpuKernelFlags(2);
  EXPECT_EQ(product.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(product.message()).find("--product_threads"),
            std::string::npos);
  absl::SetFlag(&FLAGS_product_threads, kMaxCpuProductThreads + 1);
  EXPECT_EQ(ApplyCpuKernelFlags(2).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dedit
