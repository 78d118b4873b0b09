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

#include "gtest/gtest.h"
#include "model/dedit_drafter.h"
#include "model/qwen3_model.h"
#include "model/tiny_model.h"

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

}  // namespace dedit::testing

#endif  // DEDIT_TESTS_MODEL_TEST_UTIL_H_
