// `dedit-cli generate`: streams a generation from dedit-router to the
// terminal, then prints one line of stats (tokens, tokens/s, mean
// acceptance length, rounds). Needs no libtorch: it is a gRPC client.
//
//   dedit-cli generate --router 127.0.0.1:50050 --prompt "Hello" --chat
//       --max_tokens 64
//
// Text goes to stdout as it arrives (token ids when the router has no
// tokenizer); the stats line goes to stderr so that stdout stays the text.
#ifndef DEDIT_CLI_GENERATE_COMMAND_H_
#define DEDIT_CLI_GENERATE_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dedit {

struct GenerateCommandOptions {
  std::string router = "127.0.0.1:50050";
  std::string model;
  std::string prompt;
  bool chat = false;                // wrap --prompt as one user message
  bool enable_thinking = false;     // with --chat
  std::vector<int32_t> prompt_ids;  // instead of --prompt
  int max_tokens = 128;
  float temperature = 0;
  int top_k = 0;
  float top_p = 1;
  int64_t seed = -1;  // < 0 → unseeded
  int window = 0;     // 0 → the router's default
  int passes = 0;
  bool no_speculation = false;
  // "model", "ngram", "hybrid"; empty → the router's default
  std::string method;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int timeout_s = 600;
};

// Streams one generation: text to `text_out` as it arrives, then the
// stats line to `stats_out`. The router's status passes through
// (INVALID_ARGUMENT for a bad request, UNAVAILABLE when it is not reached,
// DEADLINE_EXCEEDED after timeout_s).
absl::Status RunGenerate(const GenerateCommandOptions& options,
                         std::ostream& text_out, std::ostream& stats_out);

// --method's value on the wire (v1::SpeculativeMethod): "model", "ngram",
// "hybrid", or "" for the router's default; INVALID_ARGUMENT otherwise.
absl::StatusOr<int> SpeculativeMethodFromName(const std::string& name);

}  // namespace dedit

#endif  // DEDIT_CLI_GENERATE_COMMAND_H_
