// FromTorchError and IsStickyDeviceError (common/model/torch_status.h) over
// error messages as libtorch 1.13 words them on CUDA and on the CPU.
#include "common/model/torch_status.h"

#include <ATen/Functions.h>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"

namespace dedit {
namespace {

TEST(IsStickyDeviceErrorTest, CudaKernelAndLibraryFailuresAreSticky) {
  for (const char* message : {
           testing::kCudaIllegalAccess,
           "libtorch: CUDA error: device-side assert triggered\n"
           "CUDA kernel errors might be asynchronously reported "
           "at some other API call,so the stacktrace below might "
           "be incorrect.\nFor debugging consider passing "
           "CUDA_LAUNCH_BLOCKING=1.\nCompile with "
           "`TORCH_USE_CUDA_DSA` to enable device-side "
           "assertions.",
           "CUDA error: misaligned address",
           "CUDA error: unspecified launch failure",
           "CUDA error: an illegal instruction was encountered",
           "CUDA error: uncorrectable ECC error encountered",
           "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when "
           "calling `cublasGemmEx( handle, opa, opb, m, n, k, "
           "&falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, "
           "&fbeta, c, CUDA_R_16BF, ldc, CUDA_R_32F, "
           "CUBLAS_GEMM_DEFAULT_TENSOR_OP)`",
           "CUDA error: CUBLAS_STATUS_INTERNAL_ERROR when calling "
           "`cublasCreate(handle)`",
           "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED",
           "an illegal memory access was encountered",
       }) {
    EXPECT_TRUE(IsStickyDeviceError(message)) << message;
  }
}

TEST(IsStickyDeviceErrorTest, OutOfMemoryAndCpuErrorsAreNot) {
  for (const char* message : {
           testing::kCudaOutOfMemory,
           "CUDA error: out of memory\nCUDA kernel errors might "
           "be asynchronously reported at some other API call,so "
           "the stacktrace below might be incorrect.",
           "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
           "`cublasCreate(handle)`",
           "[enforce fail at alloc_cpu.cpp:75] err == 0. "
           "DefaultCPUAllocator: can't allocate memory: you tried "
           "to allocate 1099511627776 bytes. Error code 12 "
           "(Cannot allocate memory)",
           "mat1 and mat2 shapes cannot be multiplied (4x3 and "
           "4x5)",
           "index out of range in self",
           "expected scalar type Float but found BFloat16",
           "",
       }) {
    EXPECT_FALSE(IsStickyDeviceError(message)) << message;
  }
}

TEST(FromTorchErrorTest, CpuErrorsAreInternalAndNotSticky) {
  absl::Status status = GuardTorch([] {
                          return at::matmul(at::ones({4, 3}), at::ones({4, 5}));
                        }).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StartsWith(status.message(), "libtorch: ")) << status;
  EXPECT_FALSE(IsStickyDeviceError(status.message())) << status;
}

}  // namespace
}  // namespace dedit
