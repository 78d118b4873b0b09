// UTF-8 validation and lossy decoding shared by the tokenizer, the streaming
// detokenizer and the CLI.
//
// "Ill-formed" follows the Unicode standard (ch. 3, table 3-7): overlong
// forms, surrogates (U+D800..U+DFFF), code points above U+10FFFF and stray
// continuation bytes are rejected. Lossy decoding replaces each *maximal
// subpart* of an ill-formed sequence by one U+FFFD, the W3C/WHATWG practice
// that Rust's String::from_utf8_lossy (and so HF tokenizers' decoders) use;
// matching it byte for byte keeps our Decode() identical to HF's.
//
//   RETURN_IF_ERROR(ValidateUtf8(text));       // INVALID_ARGUMENT at offset
//   std::string shown;
//   AppendUtf8Lossy(raw_token_bytes, &shown);  // never fails
#ifndef DEDIT_TOKENIZER_UTF8_H_
#define DEDIT_TOKENIZER_UTF8_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dedit {

// U+FFFD REPLACEMENT CHARACTER in UTF-8.
inline constexpr absl::string_view kUtf8Replacement = "\xEF\xBF\xBD";

enum class Utf8SequenceKind {
  kValid,       // `length` bytes encode `code_point`.
  kInvalid,     // The first `length` bytes (1..3) are one maximal subpart.
  kIncomplete,  // All `length` bytes are a valid prefix; more are needed.
};

struct Utf8Sequence {
  Utf8SequenceKind kind;
  size_t length;
  char32_t code_point;  // Only meaningful for kValid.
};

// Classifies the sequence that starts at bytes[0]. REQUIRES: !bytes.empty().
Utf8Sequence DecodeUtf8Sequence(absl::string_view bytes);

// Byte offset of the first ill-formed or truncated sequence, or nullopt when
// `text` is entirely well-formed UTF-8.
std::optional<size_t> FindInvalidUtf8(absl::string_view text);

// OK for well-formed UTF-8; otherwise INVALID_ARGUMENT naming the byte offset
// and the offending byte, e.g. "invalid UTF-8 at byte offset 5 (byte 0xff)".
absl::Status ValidateUtf8(absl::string_view text);

// Appends `bytes` to `out`, replacing each maximal subpart of an ill-formed
// sequence (including a truncated one at the end) by U+FFFD.
void AppendUtf8Lossy(absl::string_view bytes, std::string* out);

// Length of the longest prefix of `bytes` that ends on a sequence boundary
// such that the rest is one incomplete-but-so-far-valid sequence (at most 3
// bytes). Equals bytes.size() when nothing is pending. Used to hold back a
// character whose bytes are still arriving.
size_t Utf8CompletePrefixLength(absl::string_view bytes);

// Appends the UTF-8 encoding of `code_point` (REQUIRES: a Unicode scalar).
void AppendUtf8(char32_t code_point, std::string* out);

}  // namespace dedit

#endif  // DEDIT_TOKENIZER_UTF8_H_
