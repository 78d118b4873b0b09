// Tokenizer tests on the hand-written fixtures in testdata/ (no network):
// golden ids from HF tokenizers (golden_tiny.json), both merge formats,
// invalid input, malformed tokenizer.json files.
#include "common/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/normalizer.h"
#include "tests/tokenizer/test_util.h"

namespace dedit {
namespace {

using ::dedit::testing_util::LoadJsonOrDie;
using ::dedit::testing_util::TestDataPath;
using ::dedit::testing_util::TestDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Tokenizer> LoadFixture(const std::string& file) {
  auto tok = Tokenizer::FromFile(TestDataPath(file));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

// Every text of golden_tiny.json, for every fixture, against HF tokenizers.
TEST(TokenizerFixtureTest, MatchesHfOnEveryFixture) {
  const nlohmann::json golden = LoadJsonOrDie(TestDir() + "/golden_tiny.json");
  ASSERT_GE(golden["fixtures"].size(), 5u);
  for (const auto& fixture : golden["fixtures"]) {
    const std::string file = fixture["file"].get<std::string>();
    SCOPED_TRACE(file);
    std::unique_ptr<Tokenizer> tok = LoadFixture(file);
    ASSERT_NE(tok, nullptr);
    for (const auto& c : fixture["cases"]) {
      const std::string text = c["text"].get<std::string>();
      SCOPED_TRACE(text);
      auto ids = tok->Encode(text);
      ASSERT_TRUE(ids.ok()) << ids.status();
      EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>());
      auto decoded = tok->Decode(*ids);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      EXPECT_EQ(*decoded, c["decoded"].get<std::string>());
      DecodeOptions skip;
      skip.skip_special_tokens = true;
      EXPECT_EQ(*tok->Decode(*ids, skip),
                c["decoded_skip_special"].get<std::string>());
    }
  }
}

TEST(TokenizerFixtureTest, BothMergeFormatsGiveTheSameTokenizer) {
  std::unique_ptr<Tokenizer> pairs = LoadFixture("tiny_pairs.json");
  std::unique_ptr<Tokenizer> strings = LoadFixture("tiny_strings.json");
  ASSERT_NE(pairs, nullptr);
  ASSERT_NE(strings, nullptr);
  for (const char* text :
       {"hello world", "lowest newer wider", "caf\xC3\xA9", "Hello 123 it's"}) {
    EXPECT_EQ(*pairs->Encode(text), *strings->Encode(text)) << text;
  }
  // "hello" is fully merged: h e -> he, l l -> ll, he ll -> hell, hell o.
  auto hello = pairs->Encode("hello");
  ASSERT_TRUE(hello.ok());
  ASSERT_EQ(hello->size(), 1u);
  EXPECT_EQ(pairs->IdToToken((*hello)[0]), "hello");
}

TEST(TokenizerFixtureTest, VocabularyAccessors) {
  std::unique_ptr<Tokenizer> tok = LoadFixture("tiny_pairs.json");
  ASSERT_NE(tok, nullptr);
  const std::optional<int32_t> eos = tok->TokenToId("<eos>");
  ASSERT_TRUE(eos.has_value());
  EXPECT_TRUE(tok->IsSpecialToken(*eos));
  EXPECT_FALSE(tok->IsSpecialToken(*tok->TokenToId("<sep>")));
  EXPECT_FALSE(tok->IsSpecialToken(-1));
  EXPECT_EQ(tok->IdToToken(*eos), "<eos>");
  EXPECT_EQ(tok->TokenToId("\xC4\xA0"), 32);  // 'Ġ' is byte 0x20.
  EXPECT_EQ(tok->vocab_size(),
            static_cast<int32_t>(tok->added_tokens().back().id + 1));
  EXPECT_FALSE(tok->IdToToken(tok->vocab_size()).has_value());
  EXPECT_FALSE(tok->TokenToId("not-a-token").has_value());
}

TEST(TokenizerFixtureTest, EmptyTextHasNoIds) {
  std::unique_ptr<Tokenizer> tok = LoadFixture("tiny_gpt2.json");
  ASSERT_NE(tok, nullptr);
  auto ids = tok->Encode("");
  ASSERT_TRUE(ids.ok());
  EXPECT_TRUE(ids->empty());
  EXPECT_EQ(*tok->Decode({}), "");
}

TEST(TokenizerFixtureTest, SplitSpecialTokensEncodesThemAsText) {
  std::unique_ptr<Tokenizer> tok = LoadFixture("tiny_pairs.json");
  ASSERT_NE(tok, nullptr);
  const int32_t eos = *tok->TokenToId("<eos>");
  const int32_t sep = *tok->TokenToId("<sep>");
  EncodeOptions split;
  split.split_special_tokens = true;
  auto matched = tok->Encode("a<eos>b<sep>c");
  auto as_text = tok->Encode("a<eos>b<sep>c", split);
  ASSERT_TRUE(matched.ok());
  ASSERT_TRUE(as_text.ok());
  EXPECT_THAT(*matched, ::testing::Contains(eos));
  EXPECT_THAT(*as_text, ::testing::Not(::testing::Contains(eos)));
  // Non-special added tokens are still matched.
  EXPECT_THAT(*as_text, ::testing::Contains(sep));
  EXPECT_EQ(*tok->Decode(*as_text), "a<eos>b<sep>c");
}

TEST(TokenizerInvalidInputTest, InvalidUtf8NamesTheByteOffset) {
  std::unique_ptr<Tokenizer> tok = LoadFixture("tiny_pairs.json");
  ASSERT_NE(tok, nullptr);
  struct Case {
    std::string text;
    size_t offset;
  };
  const std::vector<Case> cases = {
      {"\xFF", 0},
      {"hello \xC3\x28 world", 6},
      {"caf\xC3\xA9 \xE2\x82", 6},  // Truncated at the end.
      {"\xED\xA0\x80 surrogate", 0},
      {"ok<eos>\xC0\xAF", 7},  // Overlong, after an added token.
      {std::string("nul\0ok\x80", 7), 6},
  };
  for (const Case& c : cases) {
    auto ids = tok->Encode(c.text);
    ASSERT_FALSE(ids.ok());
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        std::string(ids.status().message()),
        HasSubstr("invalid UTF-8 at byte offset " + std::to_string(c.offset)));
  }
}

TEST(TokenizerInvalidInputTest, DecodeRejectsUnknownIds) {
  std::unique_ptr<Tokenizer> tok = LoadFixture("tiny_pairs.json");
  ASSERT_NE(tok, nullptr);
  auto text = tok->Decode({104, tok->vocab_size() + 5});
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(text.status().message()),
              HasSubstr(absl::StrCat("token id ", tok->vocab_size() + 5,
                                     " at position 1")));
  EXPECT_FALSE(tok->Decode({-1}).ok());
  EXPECT_FALSE(tok->TokenBytes(-7).ok());
}

TEST(TokenizerInvalidInputTest, DecodeReplacesIllFormedBytes) {
  std::unique_ptr<Tokenizer> tok = LoadFixture("tiny_pairs.json");
  ASSERT_NE(tok, nullptr);
  // In the fixture, id b is the single byte b. 0xF0 0x9F 0x98 0x80 is 😀.
  EXPECT_EQ(*tok->Decode({0xF0, 0x9F, 0x98, 0x80}), "\xF0\x9F\x98\x80");
  EXPECT_EQ(*tok->Decode({0xF0, 0x9F, 0x98}), "\xEF\xBF\xBD");
  EXPECT_EQ(*tok->Decode({0x61, 0xFF, 0x62}),
            "a\xEF\xBF\xBD"
            "b");
}

// Random text over an alphabet rich in multi-byte characters, combining
// marks and whitespace: decode(encode(x)) must give NFC(x) back.
TEST(TokenizerFixtureTest, RandomTextRoundTripsToNfc) {
  std::unique_ptr<Tokenizer> tok = LoadFixture("tiny_pairs.json");
  ASSERT_NE(tok, nullptr);
  const std::vector<std::string> alphabet = {
      "a",
      "e",
      "l",
      "o",
      "w",
      " ",
      "  ",
      "\n",
      "\r\n",
      "\t",
      "'s",
      "1",
      "\xCC\x81",          // U+0301 combining acute.
      "\xC3\xA9",          // é
      "\xE4\xBD\xA0",      // 你
      "\xF0\x9F\x98\x80",  // 😀
      "\xE2\x80\x8D",      // ZWJ
      "\xE3\x80\x80",      // Ideographic space.
      "\xC2\xA0",          // NBSP
      "!",
      "<",
      "|",
      ">",
      "<eos>",
      "[mask]"};
  std::mt19937 rng(1234);
  for (int iteration = 0; iteration < 300; ++iteration) {
    std::string text;
    const int length = std::uniform_int_distribution<int>(0, 30)(rng);
    for (int i = 0; i < length; ++i) {
      text += alphabet[std::uniform_int_distribution<size_t>(
          0, alphabet.size() - 1)(rng)];
    }
    auto ids = tok->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    auto decoded = tok->Decode(*ids);
    ASSERT_TRUE(decoded.ok());
    auto nfc = NormalizeNfc(text);
    ASSERT_TRUE(nfc.ok());
    EXPECT_EQ(*decoded, *nfc) << "input: " << text;
  }
}

TEST(TokenizerFixtureTest, RandomBytesNeverCrash) {
  std::unique_ptr<Tokenizer> tok = LoadFixture("tiny_pairs.json");
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(99);
  for (int iteration = 0; iteration < 500; ++iteration) {
    std::string bytes(std::uniform_int_distribution<int>(0, 40)(rng), '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    auto ids = tok->Encode(bytes);
    if (!ids.ok()) {
      EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    EXPECT_TRUE(tok->Decode(*ids).ok());
  }
}

// --- Malformed and unsupported tokenizer.json files.

class MalformedTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = LoadJsonOrDie(TestDataPath("tiny_pairs.json"));
  }

  // Loads `doc` and returns the error; fails the test if it loads.
  absl::Status LoadError(const nlohmann::json& doc) {
    auto tok = Tokenizer::FromJson(doc.dump());
    EXPECT_FALSE(tok.ok());
    return tok.ok() ? absl::OkStatus() : tok.status();
  }

  nlohmann::json base_;
};

MATCHER_P(IsInvalidArgumentWith, substring, "") {
  return arg.code() == absl::StatusCode::kInvalidArgument &&
         std::string(arg.message()).find(substring) != std::string::npos;
}

TEST_F(MalformedTokenizerTest, TruncatedJsonIsAnErrorAtEveryLength) {
  const std::string text = base_.dump(1);
  for (size_t length = 0; length < text.size();
       length += (length < 300 ? 1 : 41)) {
    auto tok = Tokenizer::FromJson(absl::string_view(text).substr(0, length));
    ASSERT_FALSE(tok.ok()) << length;
    EXPECT_THAT(tok.status(),
                IsInvalidArgumentWith("tokenizer.json: invalid JSON"))
        << tok.status();
  }
  auto truncated = Tokenizer::FromJson(text.substr(0, text.size() / 2));
  EXPECT_THAT(std::string(truncated.status().message()), HasSubstr("line"));
}

TEST_F(MalformedTokenizerTest, NotAnObject) {
  EXPECT_THAT(LoadError(nlohmann::json::array()),
              IsInvalidArgumentWith("expected an object"));
}

TEST_F(MalformedTokenizerTest, UnknownModelType) {
  base_["model"]["type"] = "WordPiece";
  EXPECT_THAT(
      LoadError(base_),
      IsInvalidArgumentWith("model.type: \"WordPiece\" is not supported"));
}

TEST_F(MalformedTokenizerTest, MissingModel) {
  base_.erase("model");
  EXPECT_THAT(LoadError(base_), IsInvalidArgumentWith("model: missing"));
}

TEST_F(MalformedTokenizerTest, MissingOrMistypedVocab) {
  nlohmann::json missing = base_;
  missing["model"].erase("vocab");
  EXPECT_THAT(LoadError(missing),
              IsInvalidArgumentWith("model.vocab: missing"));
  base_["model"]["vocab"] = nlohmann::json::array();
  EXPECT_THAT(LoadError(base_),
              IsInvalidArgumentWith("model.vocab: expected an object"));
}

TEST_F(MalformedTokenizerTest, BadVocabIds) {
  nlohmann::json negative = base_;
  negative["model"]["vocab"]["h"] = -3;
  EXPECT_THAT(LoadError(negative), IsInvalidArgumentWith("model.vocab[\"h\"]"));
  nlohmann::json text_id = base_;
  text_id["model"]["vocab"]["h"] = "7";
  EXPECT_THAT(LoadError(text_id), IsInvalidArgumentWith("expected an integer"));
  base_["model"]["vocab"]["h"] = 2000000000;
  EXPECT_THAT(LoadError(base_),
              IsInvalidArgumentWith("exceeds the supported maximum"));
}

TEST_F(MalformedTokenizerTest, MissingMerges) {
  base_["model"].erase("merges");
  EXPECT_THAT(LoadError(base_), IsInvalidArgumentWith("model.merges: missing"));
}

TEST_F(MalformedTokenizerTest, MergeReferencingUnknownToken) {
  base_["model"]["merges"].push_back({"\xC4\xA0", "zz-unknown"});
  EXPECT_THAT(
      LoadError(base_),
      IsInvalidArgumentWith("token 'zz-unknown' is not in the vocabulary"));
}

TEST_F(MalformedTokenizerTest, MergeWhoseResultIsNotInVocab) {
  base_["model"]["merges"].push_back({"q", "q"});
  EXPECT_THAT(
      LoadError(base_),
      IsInvalidArgumentWith("merged token 'qq' is not in the vocabulary"));
}

TEST_F(MalformedTokenizerTest, MalformedMergeEntries) {
  for (const nlohmann::json& bad :
       {nlohmann::json("a b c"), nlohmann::json("ab"), nlohmann::json(7),
        nlohmann::json::array({"a"}), nlohmann::json::array({"a", 1})}) {
    nlohmann::json doc = base_;
    doc["model"]["merges"].push_back(bad);
    EXPECT_THAT(LoadError(doc), IsInvalidArgumentWith("model.merges[")) << bad;
  }
}

TEST_F(MalformedTokenizerTest, BadRegex) {
  base_["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(?i:'s|[a-";
  const absl::Status s = LoadError(base_);
  EXPECT_THAT(s,
              IsInvalidArgumentWith("pre_tokenizer.pretokenizers[0].pattern"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("does not compile"));
}

TEST_F(MalformedTokenizerTest, UnsupportedPipelineParts) {
  nlohmann::json normalizer = base_;
  normalizer["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_THAT(LoadError(normalizer),
              IsInvalidArgumentWith("unsupported normalizer 'BertNormalizer'"));
  nlohmann::json pre = base_;
  pre["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_THAT(LoadError(pre),
              IsInvalidArgumentWith("unsupported pre-tokenizer 'Metaspace'"));
  nlohmann::json behavior = base_;
  behavior["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  EXPECT_THAT(LoadError(behavior),
              IsInvalidArgumentWith("unknown split behavior"));
  nlohmann::json decoder = base_;
  decoder["decoder"] = {{"type", "WordPiece"}};
  EXPECT_THAT(LoadError(decoder),
              IsInvalidArgumentWith("unsupported decoder 'WordPiece'"));
  nlohmann::json no_decoder = base_;
  no_decoder.erase("decoder");
  EXPECT_THAT(LoadError(no_decoder), IsInvalidArgumentWith("decoder: missing"));
  nlohmann::json post = base_;
  post["post_processor"] = {{"type", "TemplateProcessing"}};
  EXPECT_THAT(
      LoadError(post),
      IsInvalidArgumentWith("unsupported post-processor 'TemplateProcessing'"));
  nlohmann::json dropout = base_;
  dropout["model"]["dropout"] = 0.1;
  EXPECT_THAT(LoadError(dropout), IsInvalidArgumentWith("model.dropout"));
  nlohmann::json unk = base_;
  unk["model"]["unk_token"] = "<unk>";
  EXPECT_THAT(LoadError(unk), IsInvalidArgumentWith("model.unk_token"));
}

TEST_F(MalformedTokenizerTest, BadAddedTokens) {
  nlohmann::json no_id = base_;
  no_id["added_tokens"][0].erase("id");
  EXPECT_THAT(LoadError(no_id),
              IsInvalidArgumentWith("added_tokens[0].id: missing"));
  nlohmann::json empty = base_;
  empty["added_tokens"][1]["content"] = "";
  EXPECT_THAT(LoadError(empty),
              IsInvalidArgumentWith("added_tokens[1].content: empty"));
  nlohmann::json flag = base_;
  flag["added_tokens"][2]["lstrip"] = "yes";
  EXPECT_THAT(LoadError(flag), IsInvalidArgumentWith("added_tokens[2].lstrip"));
  nlohmann::json list = base_;
  list["added_tokens"] = {{"id", 1}};
  EXPECT_THAT(LoadError(list), IsInvalidArgumentWith("added_tokens"));
}

TEST(TokenizerLoadTest, MissingFileIsNotFound) {
  auto tok = Tokenizer::FromFile("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dedit
