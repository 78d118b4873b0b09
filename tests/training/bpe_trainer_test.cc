// The BPE trainer writes a tokenizer.json that the project's tokenizer
// loads, that round-trips text, and that learned the corpus' frequent words.
#include "training/bpe_trainer.h"

#include <gtest/gtest.h>

#include "common/tokenizer/tokenizer.h"

namespace dedit::training {
namespace {

const char kText[] =
    "def hello(name):\n    return 'hello ' + name\n\n"
    "The hello function returns a greeting. Call hello() with a name.\n"
    "def goodbye(name):\n    return 'goodbye ' + name\n";

TEST(BpeTrainerTest, WritesATokenizerThatRoundTripsAndMergesFrequentWords) {
  BpeTrainerOptions options;
  options.vocab_size = 300;
  BpeTrainer trainer(options);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(trainer.AddText(kText).ok());
  auto json = trainer.Train();
  ASSERT_TRUE(json.ok()) << json.status();
  auto tok = Tokenizer::FromJson(*json);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_LE((*tok)->vocab_size(), 300);

  for (const std::string& text :
       {std::string(kText), std::string("unseen wörds ünïcödé ✓ \t\r\n 12345"),
        std::string("")}) {
    auto ids = (*tok)->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    auto back = (*tok)->Decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
  }
  // " hello" is frequent: one token.
  auto ids = (*tok)->Encode(" hello");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), 1u);
  // Special tokens sit right after the BPE vocabulary, in order.
  auto eot = (*tok)->TokenToId("<|endoftext|>");
  auto mask = (*tok)->TokenToId("<|mask|>");
  ASSERT_TRUE(eot && mask);
  EXPECT_EQ(*mask, *eot + 3);
  EXPECT_EQ(*mask, (*tok)->vocab_size() - 1);
  EXPECT_TRUE((*tok)->IsSpecialToken(*mask));
  auto special = (*tok)->Encode("a<|endoftext|>b");
  ASSERT_TRUE(special.ok());
  EXPECT_EQ((*special)[1], *eot);
}

TEST(BpeTrainerTest, IsDeterministic) {
  BpeTrainerOptions options;
  options.vocab_size = 280;
  BpeTrainer a(options), b(options);
  ASSERT_TRUE(a.AddText(kText).ok());
  ASSERT_TRUE(b.AddText(kText).ok());
  EXPECT_EQ(*a.Train(), *b.Train());
}

TEST(BpeTrainerTest, RejectsInvalidUtf8AndTooSmallVocabularies) {
  BpeTrainer trainer(BpeTrainerOptions{});
  EXPECT_FALSE(trainer.AddText(std::string("ab\xff")).ok());
  BpeTrainerOptions tiny;
  tiny.vocab_size = 100;
  BpeTrainer small(tiny);
  ASSERT_TRUE(small.AddText("abc").ok());
  EXPECT_EQ(small.Train().status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dedit::training
