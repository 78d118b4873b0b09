// End-of-sequence ids of a HuggingFace model folder.
//
// Generation stops on any of them. They are gathered, in this order and
// without duplicates, from
//   1. generation_config.json "eos_token_id" (what HF generate() uses;
//      Qwen3: [151645, 151643]),
//   2. config.json "eos_token_id",
//   3. tokenizer_config.json "eos_token" (a string or {"content": ...}),
//      looked up in the tokenizer (Qwen3: "<|im_end|>" -> 151645).
// "eos_token_id" may be an integer, a list of integers or null. Absent
// files and fields are skipped; a file that exists but is malformed is an
// error naming the file and field.
//
//   ASSIGN_OR_RETURN(std::vector<int32_t> eos,
//                    LoadEosTokenIds("/models/Qwen3-4B", *tokenizer));
#ifndef DEDIT_TOKENIZER_EOS_TOKEN_IDS_H_
#define DEDIT_TOKENIZER_EOS_TOKEN_IDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/tokenizer.h"

namespace dedit {

// See above. NOT_FOUND when no source names an EOS id; INVALID_ARGUMENT
// for malformed files, ids outside the tokenizer's vocabulary, or an
// eos_token string the tokenizer does not know.
absl::StatusOr<std::vector<int32_t>> LoadEosTokenIds(
    const std::string& model_dir, const Tokenizer& tokenizer);

// The "eos_token_id" field of a config document (generation_config.json or
// config.json text): an int, a list of ints, or absent/null (empty result).
// `file_name` is used in error messages.
absl::StatusOr<std::vector<int32_t>> ParseEosTokenIdField(
    absl::string_view json_text, absl::string_view file_name);

}  // namespace dedit

#endif  // DEDIT_TOKENIZER_EOS_TOKEN_IDS_H_
