#include "common/base/bounded_json.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dedit {
namespace {

using Json = nlohmann::json;

// A SAX consumer that only remembers the first syntax error. It runs on the
// failure path, to turn nlohmann's discarded value into a message with a
// position without enabling exceptions.
class ErrorRecorder : public Json::json_sax_t {
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

absl::StatusOr<Json> ParseBoundedJson(absl::string_view text,
                                      absl::string_view what, int max_depth) {
  // The parser callback sees the depth of every container as it opens (0 for
  // the top level). Returning false there drops the container, and once
  // too_deep is set every later value is dropped too, so a hostile document
  // costs one linear scan and no memory past the limit.
  bool too_deep = false;
  Json::parser_callback_t limit_depth =
      [&too_deep, max_depth](int depth, Json::parse_event_t event,
                             Json& /*parsed*/) {
        if ((event == Json::parse_event_t::object_start ||
             event == Json::parse_event_t::array_start) &&
            depth >= max_depth) {
          too_deep = true;
        }
        return !too_deep;
      };
  Json doc = Json::parse(text.begin(), text.end(), limit_depth,
                         /*allow_exceptions=*/false);
  if (too_deep) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": JSON nested deeper than ", max_depth,
                     " levels (the limit for model-folder files)"));
  }
  if (!doc.is_discarded()) return doc;
  ErrorRecorder recorder;
  Json::sax_parse(text.begin(), text.end(), &recorder);
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": invalid JSON: ", recorder.message()));
}

std::string JsonForError(const Json& value) {
  constexpr size_t kMaxStringBytes = 64;
  if (value.is_string()) {
    const std::string& s = value.get_ref<const std::string&>();
    if (s.size() <= kMaxStringBytes) return absl::StrCat("\"", s, "\"");
    // Cut on a character boundary: messages may be re-encoded as JSON.
    size_t cut = kMaxStringBytes;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) {
      --cut;
    }
    return absl::StrCat("\"", s.substr(0, cut), "...\" (", s.size(), " bytes)");
  }
  if (value.is_structured() || value.is_binary() || value.is_discarded()) {
    return value.type_name();
  }
  // A scalar: dump() neither recurses nor throws on these.
  return value.dump();
}

}  // namespace dedit
