// Normalizers of a tokenizer.json ("normalizer" field): Unicode NFC / NFD /
// NFKC / NFKD through ICU, and a Sequence of those. HF applies the
// normalizer to each stretch of text between added tokens, before
// pre-tokenization; Tokenizer does the same.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> n,
//                    ParseNormalizer(nlohmann::json{{"type", "NFC"}}));
//   std::string s = "e\u0301";
//   RETURN_IF_ERROR(n->Normalize(&s));  // s == "\u00e9"
//
// Implementations are immutable and thread-safe.
#ifndef DEDIT_TOKENIZER_NORMALIZER_H_
#define DEDIT_TOKENIZER_NORMALIZER_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dedit {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text` (valid UTF-8) in place.
  virtual absl::Status Normalize(std::string* text) const = 0;
};

// Builds the normalizer described by `spec`. A JSON null yields nullptr (no
// normalization). INVALID_ARGUMENT names the unsupported type or the bad
// field.
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(
    const nlohmann::json& spec);

// Unicode NFC, as the Qwen tokenizers apply it; used by tests and by
// callers that need the text a round trip reproduces.
absl::StatusOr<std::string> NormalizeNfc(const std::string& text);

}  // namespace dedit

#endif  // DEDIT_TOKENIZER_NORMALIZER_H_
