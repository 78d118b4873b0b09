#include "common/tokenizer/byte_level.h"

#include "common/tokenizer/utf8.h"

namespace dedit {
namespace {

bool IsPrintableLatin1(int b) {
  return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) ||
         (b >= 174 && b <= 255);
}

}  // namespace

const ByteLevelAlphabet& ByteLevelAlphabet::Get() {
  static const ByteLevelAlphabet* const kAlphabet = new ByteLevelAlphabet();
  return *kAlphabet;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  decoded_.fill(-1);
  int next_shifted = 0;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp =
        IsPrintableLatin1(b) ? static_cast<char32_t>(b) : 256 + next_shifted++;
    std::string utf8;
    AppendUtf8(cp, &utf8);
    encoded_[b].length = static_cast<uint8_t>(utf8.size());
    for (size_t i = 0; i < utf8.size(); ++i) encoded_[b].bytes[i] = utf8[i];
    decoded_[cp] = static_cast<int16_t>(b);
  }
}

void ByteLevelAlphabet::AppendEncoded(absl::string_view bytes,
                                      std::string* out) const {
  out->reserve(out->size() + 2 * bytes.size());
  for (char c : bytes) {
    const Encoded& e = encoded_[static_cast<uint8_t>(c)];
    out->append(e.bytes, e.length);
  }
}

bool ByteLevelAlphabet::AppendDecoded(absl::string_view text,
                                      std::string* out) const {
  const size_t original_size = out->size();
  size_t i = 0;
  while (i < text.size()) {
    const Utf8Sequence seq = DecodeUtf8Sequence(text.substr(i));
    const int b =
        seq.kind == Utf8SequenceKind::kValid ? Decode(seq.code_point) : -1;
    if (b < 0) {
      out->resize(original_size);
      return false;
    }
    out->push_back(static_cast<char>(b));
    i += seq.length;
  }
  return true;
}

}  // namespace dedit
