#include "common/tokenizer/eos_token_ids.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/tokenizer/test_util.h"

namespace dedit {
namespace {

using ::testing::ElementsAre;

// A fresh model folder holding the tiny fixture tokenizer; files are added
// per test.
class EosTokenIdsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/dedit_eos_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    auto tok =
        Tokenizer::FromFile(testing_util::TestDataPath("tiny_pairs.json"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
  }
  void TearDown() override {
    for (const char* name :
         {"generation_config.json", "config.json", "tokenizer_config.json"}) {
      std::remove((dir_ + "/" + name).c_str());
    }
    rmdir(dir_.c_str());
  }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }
  absl::StatusOr<std::vector<int32_t>> Load() {
    return LoadEosTokenIds(dir_, *tokenizer_);
  }

  std::string dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST(ParseEosTokenIdFieldTest, IntListNullAndAbsent) {
  EXPECT_THAT(*ParseEosTokenIdField(R"({"eos_token_id": 5})", "c"),
              ElementsAre(5));
  EXPECT_THAT(*ParseEosTokenIdField(R"({"eos_token_id": [7, 5, 7]})", "c"),
              ElementsAre(7, 5));
  EXPECT_TRUE(ParseEosTokenIdField(R"({"eos_token_id": null})", "c")->empty());
  EXPECT_TRUE(ParseEosTokenIdField(R"({"bos_token_id": 1})", "c")->empty());
}

TEST(ParseEosTokenIdFieldTest, MalformedValuesNameTheFile) {
  for (const char* bad :
       {R"({"eos_token_id": "5"})", R"({"eos_token_id": -1})",
        R"({"eos_token_id": [1, "x"]})", R"({"eos_token_id": 1.5})", R"([1])",
        R"({"eos_token_id": )"}) {
    auto ids = ParseEosTokenIdField(bad, "generation_config.json");
    ASSERT_FALSE(ids.ok()) << bad;
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("generation_config.json"),
              std::string::npos)
        << ids.status();
  }
}

TEST_F(EosTokenIdsTest, MergesAllSourcesInOrderWithoutDuplicates) {
  const int32_t eos = *tokenizer_->TokenToId("<eos>");
  Write("generation_config.json", R"({"eos_token_id": [300, 12]})");
  Write("config.json", absl::StrCat(R"({"eos_token_id": )", 12, "}"));
  Write("tokenizer_config.json", R"({"eos_token": "<eos>"})");
  auto ids = Load();
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(300, 12, eos));
}

TEST_F(EosTokenIdsTest, TokenizerConfigAloneAndAddedTokenObject) {
  const int32_t eos = *tokenizer_->TokenToId("<eos>");
  Write("tokenizer_config.json",
        R"({"eos_token": {"content": "<eos>", "special": true}})");
  EXPECT_THAT(*Load(), ElementsAre(eos));
}

TEST_F(EosTokenIdsTest, NothingFoundIsNotFound) {
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kNotFound);
  Write("config.json", R"({"eos_token_id": null})");
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kNotFound);
}

TEST_F(EosTokenIdsTest, ErrorsForBadFilesAndUnknownTokens) {
  Write("config.json", R"({"eos_token_id": 99999999})");
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kInvalidArgument);
  Write("config.json", R"({"eos_token_id": [1, 2)");
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kInvalidArgument);
  Write("config.json", R"({})");
  Write("tokenizer_config.json", R"({"eos_token": "<nope>"})");
  auto ids = Load();
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ids.status().message().find("<nope>"), std::string::npos);
}

}  // namespace
}  // namespace dedit
