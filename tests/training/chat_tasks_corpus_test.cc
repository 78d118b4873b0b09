// The chat task suite as the trainer reads it (training/corpus.h):
// conversations as documents for the target, prompts for distillation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "common/base/file_util.h"
#include "common/tokenizer/tokenizer.h"
#include "training/corpus.h"

namespace dedit::training {
namespace {

using ::testing::HasSubstr;

class ChatTasksCorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::FromFile(std::string(DEDIT_SOURCE_DIR) +
                                   "/checkpoints/tiny/target/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    path_ = ::testing::TempDir() + "/chat_tasks_corpus_test.jsonl";
  }
  void TearDown() override { std::remove(path_.c_str()); }
  void Write(const std::string& content) {
    ASSERT_TRUE(WriteFileAtomically(path_, content).ok());
  }
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string path_;
};

constexpr char kTwoTasks[] =
    R"({"family": "sort", "text": "<|im_start|>user\nSort: 3, 1<|im_end|>\n<|im_start|>assistant\n1, 3<|im_end|>\n"})"
    "\n"
    R"({"family": "add", "text": "<|im_start|>user\nAdd 1 and 2.<|im_end|>\n<|im_start|>assistant\n1+2+0=3. 1 + 2 = 3<|im_end|>\n"})"
    "\n";

TEST_F(ChatTasksCorpusTest, ConversationsBecomeDocumentsWithControlTokens) {
  Write(kTwoTasks);
  const int32_t eot = *tokenizer_->TokenToId("<|endoftext|>");
  const int32_t im_start = *tokenizer_->TokenToId("<|im_start|>");
  auto stream = TokenizeChatTasks(path_, *tokenizer_, eot);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(stream->num_documents, 2);
  EXPECT_EQ(stream->tokens.back(), eot);
  // Special tokens are recognised here (unlike in corpus text): one
  // <|im_start|> per turn, four in all.
  EXPECT_EQ(std::count(stream->tokens.begin(), stream->tokens.end(), im_start),
            4);
}

// The target trains on answers only: the loss mask is 0 over each prompt
// (through the assistant header, tokenized exactly as a client's prompt)
// and 1 over the answer, its <|im_end|> and the document's end.
TEST_F(ChatTasksCorpusTest, LossMaskCoversAnswersOnly) {
  Write(kTwoTasks);
  const int32_t eot = *tokenizer_->TokenToId("<|endoftext|>");
  auto stream = TokenizeChatTasks(path_, *tokenizer_, eot);
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_EQ(stream->loss_mask.size(), stream->tokens.size());
  auto prompts = ChatTaskPrompts(path_, *tokenizer_);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  auto answer = tokenizer_->Encode("1, 3<|im_end|>\n");
  ASSERT_TRUE(answer.ok());
  // The first document: its prompt, masked out, then its answer and <eot>.
  const size_t p = (*prompts)[0].size();
  for (size_t i = 0; i < p; ++i) {
    EXPECT_EQ(stream->tokens[i], (*prompts)[0][i]) << i;
    EXPECT_EQ(stream->loss_mask[i], 0) << i;
  }
  for (size_t i = 0; i < answer->size(); ++i) {
    EXPECT_EQ(stream->tokens[p + i], (*answer)[i]) << i;
    EXPECT_EQ(stream->loss_mask[p + i], 1) << i;
  }
  EXPECT_EQ(stream->tokens[p + answer->size()], eot);
  EXPECT_EQ(stream->loss_mask[p + answer->size()], 1);
  // The second document starts masked.
  EXPECT_EQ(stream->loss_mask[p + answer->size() + 1], 0);
}

TEST_F(ChatTasksCorpusTest, PromptsStopAfterTheAssistantHeader) {
  Write(kTwoTasks);
  auto prompts = ChatTaskPrompts(path_, *tokenizer_);
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  ASSERT_EQ(prompts->size(), 2u);
  auto text = tokenizer_->Decode((*prompts)[1]);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|im_start|>user\nAdd 1 and 2.<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST_F(ChatTasksCorpusTest, MalformedFilesNameTheLine) {
  Write(std::string(kTwoTasks) + "{\"family\": \"add\"}\n");
  auto stream = TokenizeChatTasks(path_, *tokenizer_, 0);
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stream.status().message(), HasSubstr(":3:"));
  Write("{\"text\": \"no assistant turn\"}\n");
  EXPECT_THAT(ChatTaskPrompts(path_, *tokenizer_).status().message(),
              HasSubstr("no assistant turn"));
  Write("\n");
  EXPECT_EQ(TokenizeChatTasks(path_, *tokenizer_, 0).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dedit::training
