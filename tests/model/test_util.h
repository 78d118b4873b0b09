// Helpers shared by the engine tests: scratch directories, tiny random model
// pairs loaded in process, and a plain greedy reference decoder.
#ifndef DEDIT_TESTS_MODEL_TEST_UTIL_H_
#define DEDIT_TESTS_MODEL_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

}  // namespace dedit::testing

#endif  // DEDIT_TESTS_MODEL_TEST_UTIL_H_
