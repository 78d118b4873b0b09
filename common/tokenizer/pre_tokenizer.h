// Pre-tokenizers of a tokenizer.json ("pre_tokenizer" field): they cut
// normalized text into the "words" that BPE merges within.
//
// Supported, with HF tokenizers' semantics:
//   - Split {pattern: {Regex|String}, behavior, invert}: all five behaviours
//     (Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous).
//     The regex is taken from the file and compiled with PCRE2 (regex.h).
//   - ByteLevel {add_prefix_space, use_regex}: optionally prefixes a space
//     to every piece that does not start with one, optionally splits with
//     GPT-2's own pattern, then maps bytes to the ByteLevel alphabet.
//   - Sequence {pretokenizers: [...]}: applies each step to every piece.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> pre,
//                    ParsePreTokenizer(doc["pre_tokenizer"]));
//   std::vector<std::string> pieces = {"Hello world"};
//   RETURN_IF_ERROR(pre->PreTokenize(&pieces));  // {"Hello", "Ġworld"}
//
// Implementations are immutable and thread-safe.
#ifndef DEDIT_TOKENIZER_PRE_TOKENIZER_H_
#define DEDIT_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dedit {

// GPT-2's pattern, which HF's ByteLevel pre-tokenizer uses when use_regex is
// true (it is not stored in tokenizer.json).
inline constexpr char kGpt2PreTokenizerPattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;

  // Replaces every piece by its sub-pieces, in order. Pieces that become
  // empty are dropped. REQUIRES: every piece is valid UTF-8.
  virtual absl::Status PreTokenize(std::vector<std::string>* pieces) const = 0;
};

// Builds the pre-tokenizer described by `spec`. A JSON null yields nullptr
// (the whole text is one word). INVALID_ARGUMENT names the unsupported type,
// the bad field or the regex that does not compile.
absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(
    const nlohmann::json& spec);

}  // namespace dedit

#endif  // DEDIT_TOKENIZER_PRE_TOKENIZER_H_
