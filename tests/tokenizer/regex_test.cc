#include "common/tokenizer/regex.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/tokenizer/pre_tokenizer.h"

namespace dedit {
namespace {

std::vector<std::string> MatchTexts(const Regex& re, const std::string& s) {
  std::vector<Regex::Match> matches;
  EXPECT_TRUE(re.FindAll(s, &matches).ok());
  std::vector<std::string> out;
  for (const auto& m : matches)
    out.push_back(s.substr(m.begin, m.end - m.begin));
  return out;
}

TEST(RegexTest, BadPatternIsInvalidArgumentWithOffset) {
  auto re = Regex::Compile("(abc");
  ASSERT_FALSE(re.ok());
  EXPECT_EQ(re.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(re.status().message().find("does not compile at offset 4"),
            std::string::npos)
      << re.status();
  EXPECT_FALSE(Regex::Compile("\\p{NotAProperty}").ok());
  EXPECT_FALSE(Regex::Compile("[z-a]").ok());
  EXPECT_FALSE(Regex::Compile("bad \xFF utf8").ok());
}

TEST(RegexTest, UnicodePropertiesAndCaselessNeedUcp) {
  auto re = Regex::Compile("\\s+|\\p{L}+|\\p{N}");
  ASSERT_TRUE(re.ok());
  // U+3000 and U+00A0 are \s only with UCP; Arabic-Indic digits are \p{N}.
  EXPECT_EQ(MatchTexts(**re, "\xE4\xBD\xA0\xE3\x80\x80\xC2\xA0x\xD9\xA1"),
            (std::vector<std::string>{"\xE4\xBD\xA0", "\xE3\x80\x80\xC2\xA0",
                                      "x", "\xD9\xA1"}));
  auto caseless = Regex::Compile("(?i:'s|'ll)");
  ASSERT_TRUE(caseless.ok());
  EXPECT_EQ(MatchTexts(**caseless, "'S 'lL"),
            (std::vector<std::string>{"'S", "'lL"}));
}

// Oniguruma's iterator (and so HF's Split) yields an empty match unless it
// sits right at the end of the previous match.
TEST(RegexTest, EmptyMatchesFollowOniguruma) {
  auto re = Regex::Compile("a*");
  ASSERT_TRUE(re.ok());
  std::vector<Regex::Match> m;
  ASSERT_TRUE((*re)->FindAll("baac", &m).ok());
  // Empty at 0; "aa"; not the empty match at 3 (the end of "aa"); empty at
  // 4 (the end of the subject).
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].begin, 0u);
  EXPECT_EQ(m[0].end, 0u);
  EXPECT_EQ(m[1].begin, 1u);
  EXPECT_EQ(m[1].end, 3u);
  EXPECT_EQ(m[2].begin, 4u);
  EXPECT_EQ(m[2].end, 4u);
}

TEST(RegexTest, EmptyMatchAdvancesByWholeCharacters) {
  auto re = Regex::Compile("x*");
  ASSERT_TRUE(re.ok());
  std::vector<Regex::Match> m;
  ASSERT_TRUE((*re)->FindAll("\xE4\xBD\xA0\xF0\x9F\x98\x80", &m).ok());
  for (const auto& match : m) {
    EXPECT_TRUE(match.begin == 0 || match.begin == 3 || match.begin == 7)
        << match.begin;
  }
}

TEST(RegexTest, Gpt2PatternSplitsLikeGpt2) {
  auto re = Regex::Compile(kGpt2PreTokenizerPattern);
  ASSERT_TRUE(re.ok());
  EXPECT_EQ(MatchTexts(**re, "Hello world's   end!!\n"),
            (std::vector<std::string>{"Hello", " world", "'s", "  ", " end",
                                      "!!", "\n"}));
}

TEST(RegexTest, LongSubjectDoesNotExhaustTheJitStack) {
  auto re = Regex::Compile("\\s+(?!\\S)|\\s+");
  ASSERT_TRUE(re.ok());
  const std::string spaces(200000, ' ');
  std::vector<Regex::Match> m;
  ASSERT_TRUE((*re)->FindAll(spaces + "x", &m).ok());
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].end, spaces.size() - 1);
}

}  // namespace
}  // namespace dedit
