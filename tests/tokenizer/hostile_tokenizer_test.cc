// Regression tests for hostile tokenizer.json files: each input
// here once over-read inside PCRE2, overflowed the stack, took gigabytes or
// hung. Each must now load with a clean INVALID_ARGUMENT naming the field, or
// (for the added-token bound) encode in bounded time. Deep documents are
// built as text: dump() on them would recurse.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/tokenizer/eos_token_ids.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/tokenizer/test_util.h"

namespace dedit {
namespace {

using ::dedit::testing_util::LoadJsonOrDie;
using ::dedit::testing_util::TestDataPath;
using ::testing::HasSubstr;

MATCHER_P(IsInvalidArgumentWith, substring, "") {
  return arg.code() == absl::StatusCode::kInvalidArgument &&
         std::string(arg.message()).find(substring) != std::string::npos;
}

constexpr char kHole[] = "\"@HOLE@\"";

// The tiny fixture with `field` replaced by the raw JSON text `value`.
std::string FixtureWith(const std::string& field, const std::string& value) {
  nlohmann::json doc = LoadJsonOrDie(TestDataPath("tiny_pairs.json"));
  doc[field] = "@HOLE@";
  return absl::StrReplaceAll(doc.dump(), {{kHole, value}});
}

std::string NestedSequence(int depth, const char* list, const char* leaf) {
  std::string text;
  for (int i = 0; i < depth; ++i) {
    absl::StrAppend(&text, R"({"type":"Sequence",")", list, R"(":[)");
  }
  text += leaf;
  for (int i = 0; i < depth; ++i) text += "]}";
  return text;
}

long MaxRssKb() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

TEST(HostileRegexTest, BackslashCIsRefused) {
  auto re = Regex::Compile("a+\\C");
  ASSERT_FALSE(re.ok());
  EXPECT_THAT(re.status(), IsInvalidArgumentWith("does not compile"));
  EXPECT_FALSE(Regex::Compile("(?s)\\C+").ok());
  // A literal backslash followed by C is still fine.
  EXPECT_TRUE(Regex::Compile("a\\\\C").ok());
}

TEST(HostileRegexTest, InvalidUtf8SubjectIsAnErrorNotAnOverRead) {
  auto re = Regex::Compile("\\p{L}+");
  ASSERT_TRUE(re.ok());
  std::vector<Regex::Match> matches;
  // A piece that ends inside a 3-byte character, in an exactly sized buffer.
  const std::string piece = "ab\xE2\x82";
  std::vector<char> exact(piece.begin(), piece.end());
  EXPECT_THAT(
      (*re)->FindAll(absl::string_view(exact.data(), exact.size()), &matches),
      IsInvalidArgumentWith("not valid UTF-8"));
  EXPECT_THAT((*re)->FindAll("\xFF", &matches),
              IsInvalidArgumentWith("not valid UTF-8"));
  EXPECT_TRUE((*re)->FindAll("ab\xE2\x82\xAC", &matches).ok());
}

TEST(HostileTokenizerTest, SplitOnBackslashCIsRefusedAtLoad) {
  // The reported reproducer: a Split on a+\C leaves pieces ending inside a
  // character, and the next Split matched them with NO_UTF_CHECK.
  const std::string pre = R"({"type":"Sequence","pretokenizers":[
      {"type":"Split","pattern":{"Regex":"a+\\C"},"behavior":"Isolated"},
      {"type":"Split","pattern":{"Regex":"\\p{L}"},"behavior":"Isolated"},
      {"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]})";
  auto tok = Tokenizer::FromJson(FixtureWith("pre_tokenizer", pre));
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(tok.status(),
              IsInvalidArgumentWith("pre_tokenizer.pretokenizers[0].pattern"));
}

TEST(HostileTokenizerTest, DeepValuesInsideModelFieldsAreErrors) {
  // dump() of these values in error messages overflowed the stack.
  const std::string deep(100000, '[');
  const std::string value = deep + std::string(100000, ']');
  nlohmann::json doc = LoadJsonOrDie(TestDataPath("tiny_pairs.json"));
  for (const char* field : {"dropout", "type"}) {
    SCOPED_TRACE(field);
    nlohmann::json copy = doc;
    copy["model"][field] = "@HOLE@";
    auto tok =
        Tokenizer::FromJson(absl::StrReplaceAll(copy.dump(), {{kHole, value}}));
    EXPECT_THAT(tok.status(), IsInvalidArgumentWith("nested deeper than 64"));
  }
  nlohmann::json merges = doc;
  merges["model"]["merges"][0] = "@HOLE@";
  auto tok =
      Tokenizer::FromJson(absl::StrReplaceAll(merges.dump(), {{kHole, value}}));
  EXPECT_THAT(tok.status(), IsInvalidArgumentWith("nested deeper than 64"));
  // Within the limit, the message names the type, never the whole value.
  merges["model"]["merges"][0] = nlohmann::json::array({{{"a"}}});
  tok = Tokenizer::FromJson(merges.dump());
  EXPECT_THAT(tok.status(), IsInvalidArgumentWith("model.merges[0]"));
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("got array"));
}

TEST(HostileTokenizerTest, DeepSequencesAreRefusedInBoundedMemory) {
  // 15k levels reached 1.6 GB (depth^2 error paths); 20k overflowed the
  // stack. Now the parser stops at 64 levels.
  const long rss_before_kb = MaxRssKb();
  for (int depth : {15000, 20000}) {
    auto normalizer = Tokenizer::FromJson(
        FixtureWith("normalizer",
                    NestedSequence(depth, "normalizers", R"({"type":"NFC"})")));
    EXPECT_THAT(normalizer.status(),
                IsInvalidArgumentWith("nested deeper than 64"));
    auto pre = Tokenizer::FromJson(FixtureWith(
        "pre_tokenizer",
        NestedSequence(depth, "pretokenizers",
                       R"({"type":"ByteLevel","add_prefix_space":false})")));
    EXPECT_THAT(pre.status(), IsInvalidArgumentWith("nested deeper than 64"));
  }
  EXPECT_LT(MaxRssKb() - rss_before_kb, 256 * 1024);
}

TEST(HostileTokenizerTest, SequencesWithinTheLimitStillWork) {
  // 30 Sequences is 61 levels with the document itself: allowed.
  auto tok = Tokenizer::FromJson(FixtureWith(
      "pre_tokenizer",
      NestedSequence(30, "pretokenizers",
                     R"({"type":"ByteLevel","add_prefix_space":false})")));
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto ids = (*tok)->Encode("hello world");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*(*tok)->Decode(*ids), "hello world");
}

TEST(HostileTokenizerTest, AddedTokenLengthIsBounded) {
  nlohmann::json doc = LoadJsonOrDie(TestDataPath("tiny_pairs.json"));
  doc["added_tokens"][0]["content"] = std::string(kMaxAddedTokenBytes + 1, 'a');
  auto tok = Tokenizer::FromJson(doc.dump());
  EXPECT_THAT(tok.status(), IsInvalidArgumentWith("added_tokens[0].content"));
  EXPECT_THAT(std::string(tok.status().message()),
              HasSubstr("added-token limit of 256"));

  // The longest allowed token against text that matches all but its last
  // byte at every position: the worst case for the matcher, bounded by
  // text x 256 steps.
  doc["added_tokens"][0]["content"] =
      std::string(kMaxAddedTokenBytes - 1, 'a') + "b";
  tok = Tokenizer::FromJson(doc.dump());
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string text(100000, 'a');
  const auto start = std::chrono::steady_clock::now();
  auto ids = (*tok)->Encode(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_LT(seconds, 20.0);
}

TEST(HostileTokenizerTest, NormalizedAddedTokenLengthIsBounded) {
  // U+FDFA expands to 33 bytes under NFKD: 10 of them (30 bytes) become
  // 330 bytes, over the bound, though the content itself is short.
  nlohmann::json doc = LoadJsonOrDie(TestDataPath("tiny_pairs.json"));
  doc["normalizer"] = {{"type", "NFKD"}};
  std::string content;
  for (int i = 0; i < 10; ++i) content += "\xEF\xB7\xBA";
  doc["added_tokens"][0]["content"] = content;
  doc["added_tokens"][0]["normalized"] = true;
  auto tok = Tokenizer::FromJson(doc.dump());
  EXPECT_THAT(tok.status(), IsInvalidArgumentWith("once normalized"));
}

TEST(HostileTokenizerTest, FifoTokenizerIsRefusedNotWaitedOn) {
  char tmpl[] = "/tmp/dedit_hostile_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = absl::StrCat(tmpl, "/tokenizer.json");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto tok = Tokenizer::FromFile(path);
  EXPECT_THAT(tok.status(), IsInvalidArgumentWith("not a regular file"));
  ::unlink(path.c_str());
  ::rmdir(tmpl);
}

TEST(HostileTokenizerTest, HugeTokenizerJsonIsRefusedBeforeReading) {
  char tmpl[] = "/tmp/dedit_hostile_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = absl::StrCat(tmpl, "/tokenizer.json");
  { std::ofstream(path) << "{}"; }
  ASSERT_EQ(::truncate(path.c_str(), 65 << 20), 0);  // Sparse.
  auto tok = Tokenizer::FromFile(path);
  EXPECT_THAT(tok.status(), IsInvalidArgumentWith("over the limit"));
  ::unlink(path.c_str());
  ::rmdir(tmpl);
}

TEST(HostileTokenizerTest, EosListsAreBounded) {
  std::string ids = "[0";
  for (int i = 0; i < 1024; ++i) ids += ",0";
  ids += "]";
  auto eos = ParseEosTokenIdField(
      absl::StrCat(R"({"eos_token_id": )", ids, "}"), "generation_config.json");
  EXPECT_THAT(eos.status(),
              IsInvalidArgumentWith("generation_config.json eos_token_id"));
  for (const char* bad : {"-5", "4294967297", "1.5"}) {
    eos = ParseEosTokenIdField(absl::StrCat(R"({"eos_token_id": )", bad, "}"),
                               "config.json");
    EXPECT_THAT(eos.status(), IsInvalidArgumentWith("config.json eos_token_id"))
        << bad;
  }
}

}  // namespace
}  // namespace dedit
