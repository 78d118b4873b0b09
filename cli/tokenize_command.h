// `dedit-cli tokenize`: batch encode/decode through the JSON shapes that
// scripts and tests use.
//
//   encode: stdin  ["Hello", "<|im_start|>user\n..."]
//           stdout [[9707], [151644, 872, 198, ...]]
//   decode: stdin  [[9707], [151644, 872]]       (--decode)
//           stdout ["Hello", "<|im_start|>user"]
//
// Output is one line of compact JSON followed by a newline. Errors name the
// input element, e.g. "input[2][7]: token id 999999 at position 7 is not in
// the vocabulary". Input that is not valid JSON (including invalid UTF-8 or
// lone surrogate escapes in strings) is rejected with line and column.
//
//   TokenizeCommandOptions options;
//   options.tokenizer_path = "tokenizer.json";
//   absl::Status s = RunTokenizeCommand(options, std::cin, std::cout);
#ifndef DEDIT_CLI_TOKENIZE_COMMAND_H_
#define DEDIT_CLI_TOKENIZE_COMMAND_H_

#include <iosfwd>
#include <string>

#include "absl/status/status.h"

namespace dedit {

struct TokenizeCommandOptions {
  std::string tokenizer_path;         // A tokenizer.json file.
  bool decode = false;                // Ids -> text instead of text -> ids.
  bool skip_special_tokens = false;   // Decode only.
  bool split_special_tokens = false;  // Encode only.
};

// Reads the whole of `in`, writes the result to `out`. INVALID_ARGUMENT for
// malformed input; errors from loading the tokenizer pass through.
absl::Status RunTokenizeCommand(const TokenizeCommandOptions& options,
                                std::istream& in, std::ostream& out);

}  // namespace dedit

#endif  // DEDIT_CLI_TOKENIZE_COMMAND_H_
