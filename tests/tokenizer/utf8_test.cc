#include "common/tokenizer/utf8.h"

#include <gtest/gtest.h>

#include <string>

#include "common/tokenizer/byte_level.h"

namespace dedit {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8Test, AcceptsWellFormedText) {
  EXPECT_FALSE(FindInvalidUtf8("").has_value());
  EXPECT_FALSE(
      FindInvalidUtf8("plain ascii text, longer than 8 bytes").has_value());
  EXPECT_FALSE(
      FindInvalidUtf8("\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80").has_value());
  EXPECT_FALSE(FindInvalidUtf8("\xF4\x8F\xBF\xBF").has_value());  // U+10FFFF
  EXPECT_FALSE(FindInvalidUtf8(std::string("a\0b", 3)).has_value());
  EXPECT_TRUE(ValidateUtf8("\xEF\xBF\xBE").ok());  // U+FFFE is a scalar.
}

TEST(Utf8Test, FindsFirstIllFormedByteOffset) {
  EXPECT_EQ(FindInvalidUtf8("\xFF"), 0u);
  EXPECT_EQ(FindInvalidUtf8("abcdefghij\x80"), 10u);   // After the 8-byte skip.
  EXPECT_EQ(FindInvalidUtf8("ab\xC0\xAF"), 2u);        // Overlong '/'.
  EXPECT_EQ(FindInvalidUtf8("\xE0\x80\xAF"), 0u);      // Overlong 3-byte.
  EXPECT_EQ(FindInvalidUtf8("x\xED\xA0\x80"), 1u);     // Surrogate U+D800.
  EXPECT_EQ(FindInvalidUtf8("\xF4\x90\x80\x80"), 0u);  // Above U+10FFFF.
  EXPECT_EQ(FindInvalidUtf8("\xF5\x80\x80\x80"), 0u);
  EXPECT_EQ(FindInvalidUtf8("ok\xE4\xB8"), 2u);  // Truncated at end.
  EXPECT_EQ(FindInvalidUtf8("\xC3\xA9\xC3"), 2u);
}

TEST(Utf8Test, ValidateNamesOffsetAndByte) {
  const absl::Status s = ValidateUtf8("hello \xFFworld");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "invalid UTF-8 at byte offset 6 (byte 0xff)");
  const absl::Status t = ValidateUtf8("abc\xF0\x9F\x98");
  EXPECT_EQ(t.message(),
            "invalid UTF-8 at byte offset 3 (byte 0xf0, truncated sequence)");
}

// The examples of "U+FFFD substitution of maximal subparts" from the
// Unicode standard (ch. 3.9, tables 3-8 to 3-11), which Rust's
// from_utf8_lossy and so HF's decoders follow.
TEST(Utf8Test, LossyReplacesMaximalSubparts) {
  auto lossy = [](const std::string& bytes) {
    std::string out;
    AppendUtf8Lossy(bytes, &out);
    return out;
  };
  EXPECT_EQ(lossy("a\xC0\xAF"
                  "b"),
            "a" + kFffd + kFffd + "b");
  EXPECT_EQ(lossy("\xE0\x80\xAF"), kFffd + kFffd + kFffd);
  EXPECT_EQ(lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(lossy("\xF4\x91\x92\x93"), kFffd + kFffd + kFffd + kFffd);
  // A truncated sequence is one maximal subpart.
  EXPECT_EQ(lossy("\xF0\x9F\x98"), kFffd);
  EXPECT_EQ(lossy("\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41"),
            kFffd + kFffd + kFffd + kFffd + "A");
  EXPECT_EQ(
      lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
      "a" + kFffd + kFffd + kFffd + "b" + kFffd + "c" + kFffd + kFffd + "d");
  EXPECT_EQ(lossy("valid \xC3\xA9"), "valid \xC3\xA9");
}

TEST(Utf8Test, CompletePrefixHoldsBackOnlyAnIncompleteTail) {
  EXPECT_EQ(Utf8CompletePrefixLength(""), 0u);
  EXPECT_EQ(Utf8CompletePrefixLength("abc"), 3u);
  EXPECT_EQ(Utf8CompletePrefixLength("ab\xF0"), 2u);
  EXPECT_EQ(Utf8CompletePrefixLength("ab\xF0\x9F"), 2u);
  EXPECT_EQ(Utf8CompletePrefixLength("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(Utf8CompletePrefixLength("ab\xF0\x9F\x98\x80"), 6u);
  // Ill-formed bytes are not held back: waiting cannot fix them.
  EXPECT_EQ(Utf8CompletePrefixLength("ab\x80"), 3u);
  EXPECT_EQ(Utf8CompletePrefixLength("ab\xF0\x41"), 4u);
  EXPECT_EQ(Utf8CompletePrefixLength("\xE0\x80"), 2u);  // Overlong: invalid.
  // A lead byte after an invalid one.
  EXPECT_EQ(Utf8CompletePrefixLength("\xF0\x9F\xE2"), 2u);
}

TEST(ByteLevelTest, IsABijectionWithGpt2Alphabet) {
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  EXPECT_EQ(alphabet.Encode(' '), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(alphabet.Encode('\n'), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(alphabet.Encode('A'), "A");
  EXPECT_EQ(alphabet.Encode(0xAD), "\xC5\x83");  // Soft hyphen -> U+0143.
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string encoded;
  alphabet.AppendEncoded(all, &encoded);
  std::string decoded;
  ASSERT_TRUE(alphabet.AppendDecoded(encoded, &decoded));
  EXPECT_EQ(decoded, all);
  std::string untouched = "x";
  EXPECT_FALSE(alphabet.AppendDecoded("\xE4\xB8\xAD", &untouched));  // '中'
  EXPECT_EQ(untouched, "x");
}

}  // namespace
}  // namespace dedit
