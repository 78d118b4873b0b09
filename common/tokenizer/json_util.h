// Exception-free JSON helpers for the tokenizer's file formats
// (tokenizer.json, tokenizer_config.json, generation_config.json) and the
// CLI's stdin. nlohmann::json is used with allow_exceptions=false, and only
// after a type check, so malformed input yields a Status, never a throw.
//
//   ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
//   ASSIGN_OR_RETURN(nlohmann::json doc, ParseJson(text, path));
//   ASSIGN_OR_RETURN(int32_t id, JsonToInt32(doc["id"], "added_tokens[0].id"));
#ifndef DEDIT_TOKENIZER_JSON_UTIL_H_
#define DEDIT_TOKENIZER_JSON_UTIL_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/base/file_util.h"  // ReadFileToString

namespace dedit {

// Parses `text` (ParseBoundedJson, common/base/bounded_json.h: at most
// kMaxJsonDepth levels). INVALID_ARGUMENT "<what>: invalid JSON: ... line L,
// column C ..." on a syntax error (truncation included), "<what>: JSON
// nested deeper than 64 levels" past the depth limit.
absl::StatusOr<nlohmann::json> ParseJson(absl::string_view text,
                                         absl::string_view what);

// A JSON integer in [0, 2^31). INVALID_ARGUMENT naming `where` otherwise.
absl::StatusOr<int32_t> JsonToTokenId(const nlohmann::json& value,
                                      absl::string_view where);

// Optional boolean member of `object`: `fallback` when absent or null,
// INVALID_ARGUMENT when present with another type.
absl::StatusOr<bool> JsonOptionalBool(const nlohmann::json& object,
                                      const char* key, bool fallback,
                                      absl::string_view where);

// Required string member of `object`.
absl::StatusOr<std::string> JsonRequiredString(const nlohmann::json& object,
                                               const char* key,
                                               absl::string_view where);

}  // namespace dedit

#endif  // DEDIT_TOKENIZER_JSON_UTIL_H_
