#include "tokenizer/json_util.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace dedit {
namespace {

// A SAX consumer that only remembers the first syntax error. It is used on
// the failure path, to turn nlohmann's discarded value into a message with
// a position, without enabling exceptions.
class ErrorRecorder : public nlohmann::json::json_sax_t {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) override {
    message_ = ex.what();
    // Drop nlohmann's "[json.exception.parse_error.101] " tag.
    const size_t tag_end = message_.find("] ");
    if (message_.rfind("[json.exception", 0) == 0 &&
        tag_end != std::string::npos) {
      message_ = message_.substr(tag_end + 2);
    }
    return false;
  }

  const std::string& message() const { return message_; }

 private:
  std::string message_ = "syntax error";
};

}  // namespace

absl::StatusOr<nlohmann::json> ParseJson(absl::string_view text,
                                         absl::string_view what) {
  nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(),
                                             /*cb=*/nullptr,
                                             /*allow_exceptions=*/false);
  if (!doc.is_discarded()) return doc;
  ErrorRecorder recorder;
  nlohmann::json::sax_parse(text.begin(), text.end(), &recorder);
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": invalid JSON: ", recorder.message()));
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
      where, ": token id ", value.dump(), " is outside [0, 2^31)"));
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
