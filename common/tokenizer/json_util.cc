#include "common/tokenizer/json_util.h"

#include "absl/strings/str_cat.h"
#include "common/base/bounded_json.h"

namespace dedit {

absl::StatusOr<nlohmann::json> ParseJson(absl::string_view text,
                                         absl::string_view what) {
  return ParseBoundedJson(text, what);
}

absl::StatusOr<int32_t> JsonToTokenId(const nlohmann::json& value,
                                      absl::string_view where) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v <= static_cast<uint64_t>(INT32_MAX)) return static_cast<int32_t>(v);
  } else if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 0 && v <= INT32_MAX) return static_cast<int32_t>(v);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected an integer token id, got ", value.type_name()));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      where, ": token id ", JsonForError(value), " is outside [0, 2^31)"));
}

absl::StatusOr<bool> JsonOptionalBool(const nlohmann::json& object,
                                      const char* key, bool fallback,
                                      absl::string_view where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".", key, ": expected a boolean, got ", it->type_name()));
  }
  return it->get<bool>();
}

absl::StatusOr<std::string> JsonRequiredString(const nlohmann::json& object,
                                               const char* key,
                                               absl::string_view where) {
  auto it = object.find(key);
  if (it == object.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".", key, ": missing"));
  }
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".", key, ": expected a string, got ", it->type_name()));
  }
  return it->get<std::string>();
}

}  // namespace dedit
