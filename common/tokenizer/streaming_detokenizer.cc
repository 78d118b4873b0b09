#include "common/tokenizer/streaming_detokenizer.h"

#include <utility>

#include "common/base/status.h"
#include "common/tokenizer/utf8.h"

namespace dedit {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer* tokenizer,
                                           DecodeOptions options)
    : tokenizer_(tokenizer), options_(options) {}

absl::StatusOr<std::string> StreamingDetokenizer::Push(int32_t id) {
  ASSIGN_OR_RETURN(absl::string_view bytes, tokenizer_->TokenBytes(id));
  if (options_.skip_special_tokens && tokenizer_->IsSpecialToken(id)) {
    return std::string();
  }
  std::string buffer = std::move(pending_);
  buffer.append(bytes.data(), bytes.size());
  // Cutting only before a pending lead byte keeps the result identical to
  // decoding everything at once: no ill-formed subpart can straddle it.
  const size_t complete = Utf8CompletePrefixLength(buffer);
  pending_.assign(buffer, complete, std::string::npos);
  buffer.resize(complete);
  if (!FindInvalidUtf8(buffer).has_value()) return buffer;
  std::string text;
  AppendUtf8Lossy(buffer, &text);
  return text;
}

std::string StreamingDetokenizer::Flush() {
  std::string text;
  AppendUtf8Lossy(pending_, &text);
  pending_.clear();
  return text;
}

}  // namespace dedit
