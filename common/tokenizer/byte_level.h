// The GPT-2 "ByteLevel" alphabet: a bijection between the 256 byte values
// and 256 printable code points, so that any byte string becomes a string of
// visible characters that BPE can merge. Bytes that are printable Latin-1
// (33..126, 161..172, 174..255) map to themselves; the other 68 map to
// U+0100.. in byte order (so ' ' -> 'Ġ' U+0120, '\n' -> 'Ċ' U+010A).
//
//   const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
//   std::string mapped;
//   alphabet.AppendEncoded(" hi", &mapped);        // "Ġhi"
//   std::string raw;
//   bool ok = alphabet.AppendDecoded("Ġhi", &raw);  // raw == " hi"
#ifndef DEDIT_TOKENIZER_BYTE_LEVEL_H_
#define DEDIT_TOKENIZER_BYTE_LEVEL_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace dedit {

class ByteLevelAlphabet {
 public:
  // The process-wide immutable instance; thread-safe.
  static const ByteLevelAlphabet& Get();

  // UTF-8 of the character that stands for byte `b`.
  absl::string_view Encode(uint8_t b) const {
    return absl::string_view(encoded_[b].bytes, encoded_[b].length);
  }

  // Appends the mapped characters of every byte of `bytes`.
  void AppendEncoded(absl::string_view bytes, std::string* out) const;

  // Byte value that `code_point` stands for, or -1 when it is not one of the
  // 256 alphabet characters.
  int Decode(char32_t code_point) const {
    return code_point < decoded_.size() ? decoded_[code_point] : -1;
  }

  // Appends the bytes that the characters of `text` (UTF-8) stand for and
  // returns true; returns false and leaves `out` unchanged when some
  // character is outside the alphabet (or `text` is not valid UTF-8).
  bool AppendDecoded(absl::string_view text, std::string* out) const;

 private:
  ByteLevelAlphabet();

  struct Encoded {
    char bytes[2];
    uint8_t length;
  };
  std::array<Encoded, 256> encoded_;
  // Indexed by code point; every alphabet character is below U+0144.
  std::array<int16_t, 0x144> decoded_;
};

}  // namespace dedit

#endif  // DEDIT_TOKENIZER_BYTE_LEVEL_H_
