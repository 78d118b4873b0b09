// Fuzzes Tokenizer::FromJson on whole tokenizer.json files. A file that
// loads must then encode a fixed mixed-script text (ids in range) and decode
// it without error.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tokenizer = dedit::Tokenizer::FromJson(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!tokenizer.ok()) {
    FUZZ_CHECK(!tokenizer.status().message().empty());
    return 0;
  }
  const dedit::Tokenizer& tok = **tokenizer;
  // Encode may still fail on a loaded file (e.g. PCRE2's match limit on a
  // catastrophic pattern); it must then say so, not crash.
  auto ids = tok.Encode("Hello wörld <eos> 123 \xE4\xBD\xA0\xE5\xA5\xBD!\n");
  if (!ids.ok()) return 0;
  for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  FUZZ_CHECK(tok.Decode(*ids).ok());
  return 0;
}
