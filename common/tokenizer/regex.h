// A compiled PCRE2 pattern for the pre-tokenizer's Split rules.
//
// HF tokenizers compiles tokenizer.json patterns with Oniguruma; the Qwen and
// GPT-2 patterns use \p{L}, \p{N}, \s, (?i:...) and a negative lookahead,
// which PCRE2 interprets the same way once compiled with UTF and UCP (Unicode
// properties for \s, \w, \d and caseless matching). RE2 and std::regex cannot
// express them. Iteration over matches follows Oniguruma's find_iter, so that
// empty matches split text exactly as HF does.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Regex> re, Regex::Compile("\\p{N}"));
//   std::vector<Regex::Match> matches;
//   RETURN_IF_ERROR(re->FindAll("a12", &matches));  // {1,2}, {2,3}
//
// Thread-safe: FindAll is const and allocates its own match state.
#ifndef DEDIT_TOKENIZER_REGEX_H_
#define DEDIT_TOKENIZER_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dedit {

class Regex {
 public:
  struct Match {
    size_t begin;  // Byte offsets into the subject, end exclusive.
    size_t end;
  };

  // Compiles `pattern` with UTF and UCP. INVALID_ARGUMENT naming the
  // position and PCRE2's reason when the pattern does not compile, or uses
  // \C (one byte inside a character; PCRE2_NEVER_BACKSLASH_C).
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(
      absl::string_view pattern);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Replaces `matches` by every non-overlapping match in `subject`, left to
  // right. An empty match directly at the end of the previous match is
  // skipped (the search moves on by one character), as Oniguruma's iterator
  // does. INVALID_ARGUMENT when `subject` is not valid UTF-8 (PCRE2 checks
  // it once per call), RESOURCE_EXHAUSTED if PCRE2's match limits are hit.
  absl::Status FindAll(absl::string_view subject,
                       std::vector<Match>* matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, void* code);

  std::string pattern_;
  void* code_;  // pcre2_code_8*, kept opaque so that users skip pcre2.h.
};

}  // namespace dedit

#endif  // DEDIT_TOKENIZER_REGEX_H_
