#include "common/tokenizer/utf8.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_format.h"

namespace dedit {
namespace {

inline bool InRange(uint8_t b, uint8_t lo, uint8_t hi) {
  return b >= lo && b <= hi;
}

}  // namespace

Utf8Sequence DecodeUtf8Sequence(absl::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {Utf8SequenceKind::kValid, 1, b0};

  // Table 3-7 of the Unicode standard: the lead byte fixes the length and the
  // allowed range of the *second* byte; later bytes are always 80..BF.
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  char32_t cp;
  if (InRange(b0, 0xC2, 0xDF)) {
    need = 2;
    cp = b0 & 0x1F;
  } else if (InRange(b0, 0xE0, 0xEF)) {
    need = 3;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // No overlongs.
    if (b0 == 0xED) hi = 0x9F;  // No surrogates.
  } else if (InRange(b0, 0xF0, 0xF4)) {
    need = 4;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // No overlongs.
    if (b0 == 0xF4) hi = 0x8F;  // Nothing above U+10FFFF.
  } else {
    return {Utf8SequenceKind::kInvalid, 1, 0};
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= n) return {Utf8SequenceKind::kIncomplete, n, 0};
    const uint8_t b = p[i];
    const bool ok = (i == 1) ? InRange(b, lo, hi) : InRange(b, 0x80, 0xBF);
    if (!ok) return {Utf8SequenceKind::kInvalid, i, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Utf8SequenceKind::kValid, need, cp};
}

std::optional<size_t> FindInvalidUtf8(absl::string_view text) {
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // Skip ASCII eight bytes at a time: most prompts are mostly ASCII.
    if (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, text.data() + i, 8);
      if ((word & 0x8080808080808080ULL) == 0) {
        i += 8;
        continue;
      }
    }
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Sequence seq = DecodeUtf8Sequence(text.substr(i));
    if (seq.kind != Utf8SequenceKind::kValid) return i;
    i += seq.length;
  }
  return std::nullopt;
}

absl::Status ValidateUtf8(absl::string_view text) {
  const std::optional<size_t> bad = FindInvalidUtf8(text);
  if (!bad.has_value()) return absl::OkStatus();
  const Utf8Sequence seq = DecodeUtf8Sequence(text.substr(*bad));
  return absl::InvalidArgumentError(absl::StrFormat(
      "invalid UTF-8 at byte offset %d (byte 0x%02x%s)", *bad,
      static_cast<uint8_t>(text[*bad]),
      seq.kind == Utf8SequenceKind::kIncomplete ? ", truncated sequence" : ""));
}

void AppendUtf8Lossy(absl::string_view bytes, std::string* out) {
  size_t i = 0;
  size_t run_start = 0;  // Start of the pending run of valid bytes.
  while (i < bytes.size()) {
    if (static_cast<uint8_t>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Sequence seq = DecodeUtf8Sequence(bytes.substr(i));
    if (seq.kind == Utf8SequenceKind::kValid) {
      i += seq.length;
      continue;
    }
    out->append(bytes.data() + run_start, i - run_start);
    out->append(kUtf8Replacement.data(), kUtf8Replacement.size());
    i += seq.length;
    run_start = i;
  }
  out->append(bytes.data() + run_start, bytes.size() - run_start);
}

size_t Utf8CompletePrefixLength(absl::string_view bytes) {
  // Only a lead byte within the last three bytes can start a pending
  // sequence, so look there first and fall back to "complete".
  const size_t n = bytes.size();
  const size_t first = n > 3 ? n - 3 : 0;
  for (size_t start = first; start < n; ++start) {
    const uint8_t b = static_cast<uint8_t>(bytes[start]);
    if (b < 0xC2 || b > 0xF4) continue;
    const Utf8Sequence seq = DecodeUtf8Sequence(bytes.substr(start));
    if (seq.kind == Utf8SequenceKind::kIncomplete) return start;
  }
  return n;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace dedit
