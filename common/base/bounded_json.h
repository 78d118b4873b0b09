// JSON parsing for files dedit did not write: config.json, the safetensors
// header and shard index, tokenizer.json and its companions.
//
// nlohmann's parser itself is iterative and safe on any input, but a parsed
// document is walked recursively afterwards (dump(), the normalizer and
// pre-tokenizer Sequences), and a deeply nested one costs a stack frame and
// an allocation per level. ParseBoundedJson therefore refuses documents
// nested deeper than `max_depth` containers while parsing, before any value
// below that depth is even stored, so every later walk is bounded.
//
//   ASSIGN_OR_RETURN(nlohmann::json doc,
//                    ParseBoundedJson(text, "tokenizer.json"));
//
// Never throws: syntax errors and depth violations are INVALID_ARGUMENT
// naming `what` (and, for syntax errors, the line and column).
#ifndef DEDIT_BASE_BOUNDED_JSON_H_
#define DEDIT_BASE_BOUNDED_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace dedit {

// The deepest nesting (objects and arrays enclosing one another, the
// top-level value counting as 1) accepted in any model-folder JSON file. Real
// files stay under 10 (tokenizer.json: a Sequence of Splits is 5); 64 leaves
// room for hand-written Sequences while keeping recursion shallow.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text`, refusing nesting deeper than `max_depth` containers.
absl::StatusOr<nlohmann::json> ParseBoundedJson(absl::string_view text,
                                                absl::string_view what,
                                                int max_depth = kMaxJsonDepth);

// A short rendering of an untrusted value for an error message: numbers,
// booleans and null as JSON, strings quoted and cut at 64 bytes, arrays and
// objects by their type name only. Bounded in time and size whatever the
// value, unlike dump(), which recurses and copies everything.
std::string JsonForError(const nlohmann::json& value);

}  // namespace dedit

#endif  // DEDIT_BASE_BOUNDED_JSON_H_
