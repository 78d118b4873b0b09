// Helpers shared by the engine tests: scratch directories, tiny random model
// pairs loaded in process, and a plain greedy reference decoder.
#ifndef DEDIT_TESTS_MODEL_TEST_UTIL_H_
#define DEDIT_TESTS_MODEL_TEST_UTIL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/dedit_drafter.h"
#include "common/model/qwen3_model.h"
#include "common/model/tiny_model.h"
#include "gtest/gtest.h"

namespace dedit::testing {

// A fresh directory under $TMPDIR, removed with its contents at exit.
std::string MakeTempDir();

// Device under test: $DEDIT_TEST_DEVICE ("cpu" by default, "cuda" on a GPU
// machine).
c10::Device TestDevice();

// A tiny target + drafter written to disk and loaded (f32).
struct TinyPair {
  std::string dir;
  TinyModelSpec spec;
  std::unique_ptr<Qwen3Model> target;
  std::unique_ptr<DEditDrafter> drafter;
};
std::unique_ptr<TinyPair> MakeTinyPair(const TinyModelSpec& spec,
                                       uint64_t seed);

// Greedy decoding with the target alone, one token per forward: the ground
// truth every speculative configuration must reproduce at T = 0.
std::vector<int32_t> GreedyReference(Qwen3Model& target,
                                     const std::vector<int32_t>& prompt,
                                     int max_new_tokens);

// a and b hold the same fp32 bits.
bool BitEqual(const at::Tensor& a, const at::Tensor& b);

// The vector ISAs this CPU runs `kind`'s kernels on, narrowest first: AVX2,
// and AVX-512 where it has that too (common/model/cpu/cpu_panels.h). A test
// that runs under each (ScopedCpuIsaCap) covers the AVX2 kernels on every
// x86 CI machine, whatever its widest ISA.
std::vector<CpuIsa> CpuIsasRunning(CpuProducts kind);

// SetCpuIsaCapForTesting(cap) for a scope, the cap lifted after.
class ScopedCpuIsaCap {
 public:
  explicit ScopedCpuIsaCap(CpuIsa cap) { SetCpuIsaCapForTesting(cap); }
  ~ScopedCpuIsaCap() { SetCpuIsaCapForTesting(CpuIsa::kAvx512); }
  ScopedCpuIsaCap(const ScopedCpuIsaCap&) = delete;
  ScopedCpuIsaCap& operator=(const ScopedCpuIsaCap&) = delete;
};

// A verify block's logits must equal, to the bit, the decode steps of the
// same tokens (what keeps speculation lossless when activations or the
// cache are rounded to bf16): `target` (empty) prefills a 150-token
// prompt for two sequences; a 17-token block of the first shares its
// forward with a third sequence's prefill (other rows, other key counts),
// and the second decodes the same tokens one forward at a time.
void ExpectVerifyRowsEqualDecodeSteps(Qwen3Model& target);

// Speculation over `pair` (windows 4 and 16, one and three passes in one
// batch, one and two product threads) must reproduce `greedy`, the
// target's own greedy decoding of `prompt`, token for token.
void ExpectLosslessSpeculation(TinyPair& pair,
                               const std::vector<int32_t>& prompt,
                               const std::vector<int32_t>& greedy);

// tests/testdata/golden (the Python reference fixture) and one tensor of its
// expected.safetensors, on the CPU (I64 → long, floats → float).
std::string GoldenDir();
at::Tensor GoldenTensor(const std::string& name);

// Deterministic pseudo-random prompt of `n` ids in [0, vocab).
std::vector<int32_t> RandomPrompt(int n, int vocab, uint64_t seed);

// A callback's value, handed across threads: pass callback() where a
// worker wants a completion, then Get() it (fails the test after 60 s).
template <typename T>
class Pending {
 public:
  std::function<void(T)> callback() {
    auto promise = promise_;
    return [promise](T value) { promise->set_value(std::move(value)); };
  }
  std::optional<T> Get() {
    if (future_.wait_for(std::chrono::seconds(60)) !=
        std::future_status::ready) {
      ADD_FAILURE() << "callback not called";
      return std::nullopt;
    }
    return future_.get();
  }
  bool ready() {
    return future_.wait_for(std::chrono::seconds(0)) ==
           std::future_status::ready;
  }

 private:
  std::shared_ptr<std::promise<T>> promise_ =
      std::make_shared<std::promise<T>>();
  std::future<T> future_ = promise_->get_future();
};

// The workers' before_forward_for_test seam (target_service/target_worker.h,
// drafter_service/drafter_worker.h) as a test drives it: counts the model
// forwards, can hold the next one until Resume(), and can fail the next
// ones with given statuses. Thread-safe; hook() may outlive it.
class ForwardSeam {
 public:
  std::function<absl::Status()> hook() const {
    return [state = state_] {
      absl::MutexLock lock(&state->mu);
      ++state->forwards;
      if (state->hold) {
        state->hold = false;
        state->held = true;
        state->mu.Await(absl::Condition(&state->resumed));
      }
      if (state->fail.empty()) return absl::OkStatus();
      absl::Status status = state->fail.front();
      state->fail.erase(state->fail.begin());
      return status;
    };
  }
  int forwards() const {
    absl::MutexLock lock(&state_->mu);
    return state_->forwards;
  }
  // The next forward waits in the seam until Resume().
  void HoldNext() {
    absl::MutexLock lock(&state_->mu);
    state_->hold = true;
    state_->held = state_->resumed = false;
  }
  // Whether a forward is waiting in the seam within 60 s.
  bool AwaitHeld() {
    absl::MutexLock lock(&state_->mu);
    return state_->mu.AwaitWithTimeout(absl::Condition(&state_->held),
                                       absl::Seconds(60));
  }
  void Resume() {
    absl::MutexLock lock(&state_->mu);
    state_->resumed = true;
  }
  // The next forwards fail with these statuses, one each, in order.
  void FailNext(std::vector<absl::Status> statuses) {
    absl::MutexLock lock(&state_->mu);
    for (absl::Status& s : statuses) state_->fail.push_back(std::move(s));
  }

 private:
  struct State {
    absl::Mutex mu;
    int forwards ABSL_GUARDED_BY(mu) = 0;
    bool hold ABSL_GUARDED_BY(mu) = false;
    bool held ABSL_GUARDED_BY(mu) = false;
    bool resumed ABSL_GUARDED_BY(mu) = false;
    std::vector<absl::Status> fail ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// Error messages as libtorch 1.13 words them (FromTorchError adds the
// "libtorch: " prefix); common/model/torch_status.h classifies them.
inline constexpr char kCudaIllegalAccess[] =
    "libtorch: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API "
    "call,so the stacktrace below might be incorrect.\nFor debugging "
    "consider passing CUDA_LAUNCH_BLOCKING=1.";
inline constexpr char kCudaOutOfMemory[] =
    "libtorch: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 "
    "GiB total capacity; 76.80 GiB already allocated; 1.05 GiB free; 77.02 "
    "GiB reserved in total by PyTorch) If reserved memory is >> allocated "
    "memory try setting max_split_size_mb to avoid fragmentation.  See "
    "documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF";

}  // namespace dedit::testing

#endif  // DEDIT_TESTS_MODEL_TEST_UTIL_H_
