// Fuzzes Regex (PCRE2) on hostile patterns and subjects, the path ASan
// cannot see into: the input is "pattern\0subject". Matches must lie inside
// the subject, in order, and an invalid-UTF-8 subject must be an error. The
// valgrind test replays this target's inputs over uninstrumented PCRE2, with
// DEDIT_FUZZ_REGEX_NO_JIT set once to take PCRE2's interpreter instead of
// the JIT ("(*NO_JIT)" leads the pattern).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/utf8.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  if (nul == absl::string_view::npos) return 0;
  static const bool no_jit = std::getenv("DEDIT_FUZZ_REGEX_NO_JIT") != nullptr;
  std::string pattern(input.substr(0, nul));
  if (no_jit) pattern.insert(0, "(*NO_JIT)");
  auto regex = dedit::Regex::Compile(pattern);
  if (!regex.ok()) return 0;
  // An exactly sized copy, so that a read past the subject is out of bounds.
  const absl::string_view rest = input.substr(nul + 1);
  std::vector<char> subject(rest.begin(), rest.end());
  const absl::string_view view(subject.data(), subject.size());
  std::vector<dedit::Regex::Match> matches;
  const absl::Status status = (*regex)->FindAll(view, &matches);
  if (!dedit::ValidateUtf8(view).ok()) {
    FUZZ_CHECK(!status.ok());
    return 0;
  }
  if (!status.ok()) return 0;  // Match limit: an error, not a crash.
  size_t previous_end = 0;
  for (const dedit::Regex::Match& m : matches) {
    FUZZ_CHECK(m.begin >= previous_end && m.begin <= m.end);
    FUZZ_CHECK(m.end <= view.size());
    // Matches never cut a character: \C is refused.
    FUZZ_CHECK(dedit::ValidateUtf8(view.substr(m.begin, m.end - m.begin)).ok());
    previous_end = m.end;
  }
  return 0;
}
