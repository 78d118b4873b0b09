#include "common/tokenizer/streaming_detokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/tokenizer/utf8.h"
#include "tests/tokenizer/test_util.h"

namespace dedit {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

// In the tiny fixtures, token id b (< 256) is the single byte b, so every
// multi-byte character spans several tokens.
class StreamingDetokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok =
        Tokenizer::FromFile(testing_util::TestDataPath("tiny_pairs.json"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
  }

  // Pushes `ids` and returns each Push() result.
  std::vector<std::string> PushAll(StreamingDetokenizer& detok,
                                   const std::vector<int32_t>& ids) {
    std::vector<std::string> out;
    for (int32_t id : ids) {
      auto delta = detok.Push(id);
      EXPECT_TRUE(delta.ok()) << delta.status();
      out.push_back(delta.ok() ? *delta : "<error>");
    }
    return out;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(StreamingDetokenizerTest,
       EmojiSplitAcrossTokensIsHeldBackUntilComplete) {
  StreamingDetokenizer detok(tokenizer_.get());
  // "a😀b": 😀 = F0 9F 98 80.
  EXPECT_EQ(
      PushAll(detok, {'a', 0xF0, 0x9F, 0x98, 0x80, 'b'}),
      (std::vector<std::string>{"a", "", "", "", "\xF0\x9F\x98\x80", "b"}));
  EXPECT_EQ(detok.pending_bytes(), 0u);
  EXPECT_EQ(detok.Flush(), "");
}

TEST_F(StreamingDetokenizerTest, ZwjSequenceIsEmittedCharacterByCharacter) {
  StreamingDetokenizer detok(tokenizer_.get());
  // 👩‍💻 = U+1F469 U+200D U+1F4BB; each completes on its last byte.
  const std::vector<int32_t> ids = {0xF0, 0x9F, 0x91, 0xA9, 0xE2, 0x80,
                                    0x8D, 0xF0, 0x9F, 0x92, 0xBB};
  const std::vector<std::string> out = PushAll(detok, ids);
  EXPECT_EQ(out[3], "\xF0\x9F\x91\xA9");
  EXPECT_EQ(out[6], "\xE2\x80\x8D");
  EXPECT_EQ(out[10], "\xF0\x9F\x92\xBB");
  std::string joined;
  for (const auto& s : out) joined += s;
  EXPECT_EQ(joined, *tokenizer_->Decode(ids));
}

TEST_F(StreamingDetokenizerTest, MultiByteTokensMixWithSplitOnes) {
  StreamingDetokenizer detok(tokenizer_.get());
  auto ids = tokenizer_->Encode("caf\xC3\xA9 \xE4\xBD\xA0");  // "café 你"
  ASSERT_TRUE(ids.ok());
  std::string joined;
  for (const auto& s : PushAll(detok, *ids)) {
    // Every delta is complete UTF-8 on its own.
    EXPECT_TRUE(ValidateUtf8(s).ok()) << s;
    joined += s;
  }
  joined += detok.Flush();
  EXPECT_EQ(joined, "caf\xC3\xA9 \xE4\xBD\xA0");
}

TEST_F(StreamingDetokenizerTest, FlushReplacesADanglingSequenceWithOneFffd) {
  StreamingDetokenizer detok(tokenizer_.get());
  EXPECT_EQ(PushAll(detok, {'o', 'k', 0xF0, 0x9F, 0x98}),
            (std::vector<std::string>{"o", "k", "", "", ""}));
  EXPECT_EQ(detok.pending_bytes(), 3u);
  EXPECT_EQ(detok.Flush(), kFffd);
  EXPECT_EQ(detok.pending_bytes(), 0u);
  // Same as decoding everything at once.
  EXPECT_EQ(*tokenizer_->Decode({'o', 'k', 0xF0, 0x9F, 0x98}), "ok" + kFffd);
  // The detokenizer is reusable after Flush.
  EXPECT_EQ(PushAll(detok, {'x'}), std::vector<std::string>{"x"});
}

TEST_F(StreamingDetokenizerTest, IllFormedBytesAreReplacedImmediately) {
  StreamingDetokenizer detok(tokenizer_.get());
  // A stray continuation byte can never become valid: no need to wait.
  EXPECT_EQ(PushAll(detok, {0x80}), std::vector<std::string>{kFffd});
  // A lead byte followed by a non-continuation: the lead is replaced when
  // the next byte shows it is broken.
  EXPECT_EQ(PushAll(detok, {0xE4, 'x'}),
            (std::vector<std::string>{"", kFffd + "x"}));
  EXPECT_EQ(detok.Flush(), "");
}

TEST_F(StreamingDetokenizerTest, SpecialTokensCanBeSkipped) {
  const int32_t eos = *tokenizer_->TokenToId("<eos>");
  StreamingDetokenizer keep(tokenizer_.get());
  EXPECT_EQ(PushAll(keep, {'a', eos}),
            (std::vector<std::string>{"a", "<eos>"}));
  DecodeOptions options;
  options.skip_special_tokens = true;
  StreamingDetokenizer skip(tokenizer_.get(), options);
  // The skipped token does not break the pending character, as in Decode.
  EXPECT_EQ(PushAll(skip, {0xC3, eos, 0xA9}),
            (std::vector<std::string>{"", "", "\xC3\xA9"}));
  EXPECT_EQ(*tokenizer_->Decode({0xC3, eos, 0xA9}, options), "\xC3\xA9");
}

TEST_F(StreamingDetokenizerTest, UnknownIdIsAnErrorAndLeavesTheStreamIntact) {
  StreamingDetokenizer detok(tokenizer_.get());
  EXPECT_EQ(PushAll(detok, {0xC3}), std::vector<std::string>{""});
  auto bad = detok.Push(tokenizer_->vocab_size());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(detok.pending_bytes(), 1u);
  EXPECT_EQ(PushAll(detok, {0xA9}), std::vector<std::string>{"\xC3\xA9"});
}

}  // namespace
}  // namespace dedit
