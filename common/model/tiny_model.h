// Random Qwen3 targets and DEdit drafters in the real checkpoint format, for
// tests, demos and benchmarks (no trained weights needed).
//
//   TinyModelSpec spec;                       // small defaults
//   RETURN_IF_ERROR(WriteRandomQwen3(dir + "/target", spec.target, 1));
//   RETURN_IF_ERROR(WriteRandomDrafter(dir + "/drafter", spec.drafter, 2));
#ifndef DEDIT_MODEL_TINY_MODEL_H_
#define DEDIT_MODEL_TINY_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/base/model_config.h"

namespace dedit {

struct TinyModelSpec {
  Qwen3Config target;
  DrafterConfig drafter;
};

// A small, fast pair: vocab 128, hidden 64, 4 target layers, 2 drafter
// layers, block 32, features from target layers {1, 2}.
TinyModelSpec DefaultTinySpec();

// Writes config.json + model.safetensors with N(0, std) weights (norm
// weights near 1) from `seed`. `dtype` is "float32" or "bfloat16".
absl::Status WriteRandomQwen3(const std::string& dir, const Qwen3Config& config,
                              uint64_t seed);
absl::Status WriteRandomDrafter(const std::string& dir,
                                const DrafterConfig& config, uint64_t seed);

}  // namespace dedit

#endif  // DEDIT_MODEL_TINY_MODEL_H_
