#include "common/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/tokenizer/utf8.h"

namespace dedit {
namespace {

std::string Pcre2ErrorMessage(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  if (n < 0) return absl::StrCat("PCRE2 error ", code);
  return std::string(reinterpret_cast<const char*>(buffer), n);
}

// Frees match data on every exit path.
struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(
    absl::string_view pattern) {
  // The pattern comes from an untrusted file: validate it here so that PCRE2
  // reports a UTF error as ours, with an offset.
  absl::Status utf8 = ValidateUtf8(pattern);
  if (!utf8.ok()) return Annotate(utf8, "regex pattern");
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2_NEVER_BACKSLASH_C: \C matches one code unit even in UTF mode, so a
  // match could end inside a character. Split would then hand the next step
  // a piece that is not valid UTF-8, and pcre2_match over-reads on such
  // subjects. No tokenizer needs \C; it is refused at compile time.
  pcre2_code* code = pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
      PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C, &error_code,
      &error_offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "regex pattern does not compile at offset ", error_offset, ": ",
        Pcre2ErrorMessage(error_code), " (pattern: ", pattern, ")"));
  }
  // JIT makes the pre-tokenizer several times faster; when it is not
  // available (e.g. an unsupported CPU) pcre2_match falls back to the
  // interpreter by itself, so a failure here is not an error.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(std::string(pattern), code));
}

Regex::Regex(std::string pattern, void* code)
    : pattern_(std::move(pattern)), code_(code) {}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::Status Regex::FindAll(absl::string_view subject,
                            std::vector<Match>* matches) const {
  matches->clear();
  auto* code = static_cast<pcre2_code*>(code_);
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
      pcre2_match_data_create_from_pattern(code, nullptr));
  if (md == nullptr)
    return absl::ResourceExhaustedError("regex: out of memory");
  const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const size_t n = subject.size();
  size_t search_from = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  // PCRE2 reads past the end of a subject that is not valid UTF-8 when told
  // not to check it, so the first call lets it check the whole subject, and
  // only the later calls (which start on character boundaries of the same,
  // now validated, subject) skip the check: re-validating on every call
  // would be quadratic.
  uint32_t options = 0;
  while (search_from <= n) {
    int rc =
        pcre2_match(code, text, n, search_from, options, md.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // The JIT's fixed stack is too small for this subject; the
      // interpreter uses the heap instead.
      options |= PCRE2_NO_JIT;
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
      return absl::InvalidArgumentError(absl::StrCat(
          "regex subject is not valid UTF-8: ", Pcre2ErrorMessage(rc)));
    }
    if (rc < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("regex match failed: ", Pcre2ErrorMessage(rc)));
    }
    options |= PCRE2_NO_UTF_CHECK;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md.get());
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (begin == end && have_last && last_match_end == end) {
      if (search_from >= n) break;
      // Advance by one whole character so that the next search starts on a
      // character boundary.
      const Utf8Sequence seq = DecodeUtf8Sequence(subject.substr(search_from));
      search_from += seq.length;
      continue;
    }
    matches->push_back({begin, end});
    have_last = true;
    last_match_end = end;
    search_from = end;
  }
  return absl::OkStatus();
}

}  // namespace dedit
