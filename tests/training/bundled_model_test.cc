// The trained pair shipped in checkpoints/tiny: it loads, its tokenizer
// round-trips, speculative decoding with it is lossless, and the trained
// drafter is accepted far more often than a random drafter of the same
// shape on prompts that are not in its training corpus.
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/base/model_config.h"
#include "common/model/cpu/cpu_threads.h"
#include "common/model/in_process.h"
#include "common/tokenizer/tokenizer.h"
#include "training/trainable_models.h"

namespace dedit::training {
namespace {

const std::string kModels = std::string(DEDIT_SOURCE_DIR) + "/checkpoints/tiny";

// Mean acceptance length the trained drafter must reach at W=16 on the prompts
// below, 160 greedy tokens each (K=1 and K=2). The shipped pair (the 12-layer
// chat target continued on the unseen-word suite, with its DEdit drafter
// trained on from the first pair's; 2026-12-07) measures 1.74 and 1.72 on
// these code and prose prompts, the lookup-seeded drafter 4.61;
// checkpoints/tiny/drafter/eval.json has its held-out corpus figures and
// checkpoints/tiny/drafter/MODEL_CARD.md its held-out chat figures. A random
// drafter of the same shape measures 1.00: it never gets a token accepted.
constexpr double kAcceptanceFloor = 1.65;
constexpr double kSeededAcceptanceFloor = 2.6;  // with a margin; see its test

// Written for this test (not taken from the Python sources or docs the
// pair was trained on): code and prose of the corpus's kind.
const std::vector<std::string> kPrompts = {
    "import os\nimport sys\n\n\ndef main(argv):\n    \"\"\"Print the size of "
    "each file named in argv.\"\"\"\n    for name in argv[1:]:\n",
    "class Counter:\n    def __init__(self):\n        self.counts = {}\n\n"
    "    def add(self, key):\n",
    "The :mod:`shelve` module stores Python objects in a persistent "
    "dictionary. The keys are strings and the values can be",
    "    def close(self):\n        \"\"\"Flush and close the underlying "
    "file.\"\"\"\n        if self._file is not None:\n",
    "Return a new list containing all items from the iterable in ascending "
    "order. A custom key function can be supplied to",
    "def parse_args(args=None):\n    parser = argparse.ArgumentParser(\n"
    "        description=",
};

// tau over all prompts at T = 0, and every output checked against
// target-only greedy decoding.
struct SpecRun {
  double tau = 0;
  int rounds = 0;
};

class BundledModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SetCpuThreads(1);
    auto tok = Tokenizer::FromFile(kModels + "/target/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    for (const std::string& text : kPrompts) {
      auto ids = (*tok)->Encode(text);
      ASSERT_TRUE(ids.ok()) << ids.status();
      prompts_->push_back(*ids);
    }
    InProcessStack::Options o;
    o.target_dir = kModels + "/target";
    auto target_only = InProcessStack::Load(o);
    ASSERT_TRUE(target_only.ok()) << target_only.status();
    std::vector<GenerationRequest> requests;
    for (const auto& p : *prompts_) requests.push_back(Request(p, 1, 0));
    auto results = (*target_only)->engine().Generate(requests);
    ASSERT_TRUE(results.ok()) << results.status();
    for (const GenerationResult& r : *results) {
      ASSERT_TRUE(r.status.ok()) << r.status;
      greedy_->push_back(r.tokens);
    }
  }

  static GenerationRequest Request(const std::vector<int32_t>& prompt,
                                   int window, int passes) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_new_tokens = kNewTokens;
    r.window = window;
    r.passes = passes;
    r.ignore_eos = true;  // every prompt runs its full length
    return r;
  }

  // Speculative decoding of every prompt in one batch with `drafter_dir`.
  static SpecRun Speculate(const std::string& drafter_dir, int window,
                           int passes) {
    InProcessStack::Options o;
    o.target_dir = kModels + "/target";
    o.drafter_dir = drafter_dir;
    auto stack = InProcessStack::Load(o);
    EXPECT_TRUE(stack.ok()) << stack.status();
    if (!stack.ok()) return {};
    std::vector<GenerationRequest> requests;
    for (const auto& p : *prompts_) {
      requests.push_back(Request(p, window, passes));
    }
    auto results = (*stack)->engine().Generate(requests);
    EXPECT_TRUE(results.ok()) << results.status();
    if (!results.ok()) return {};
    std::vector<RoundRecord> rounds;
    for (size_t i = 0; i < results->size(); ++i) {
      const GenerationResult& r = (*results)[i];
      EXPECT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(r.tokens, (*greedy_)[i])
          << "prompt " << i << " W=" << window << " K=" << passes;
      rounds.insert(rounds.end(), r.rounds.begin(), r.rounds.end());
    }
    const AcceptanceSummary s = Summarize(rounds);
    EXPECT_EQ(s.fallback_rounds, 0);
    return {s.mean_acceptance_length(), static_cast<int>(s.drafted_rounds)};
  }

  static constexpr int kNewTokens = 160;
  static inline std::vector<std::vector<int32_t>>* prompts_ =
      new std::vector<std::vector<int32_t>>;
  static inline std::vector<std::vector<int32_t>>* greedy_ =
      new std::vector<std::vector<int32_t>>;
};

TEST_F(BundledModelTest, CheckpointsAndTokenizerAreConsistent) {
  auto target = LoadQwen3Config(kModels + "/target");
  ASSERT_TRUE(target.ok()) << target.status();
  auto drafter = LoadDrafterConfig(kModels + "/drafter");
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  EXPECT_EQ(drafter->layers.vocab_size, target->vocab_size);
  EXPECT_EQ(drafter->block_size, 32);  // one drafter for W = 16 and 32
  auto tok = Tokenizer::FromFile(kModels + "/target/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  // The drafter's MASK is the tokenizer's <|mask|>, inside the vocabulary.
  EXPECT_EQ(tok->get()->TokenToId("<|mask|>"),
            std::optional<int32_t>(drafter->mask_token_id));
  EXPECT_LT(drafter->mask_token_id, target->vocab_size);
  for (const std::string& text : kPrompts) {
    auto ids = (*tok)->Encode(text);
    ASSERT_TRUE(ids.ok());
    for (int32_t id : *ids) EXPECT_LT(id, target->vocab_size);
    auto back = (*tok)->Decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
  }
  // The repo stays lean: the pair (weights, tokenizers, cards) < 30 MB.
  uintmax_t bytes = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(kModels)) {
    if (e.is_regular_file()) bytes += e.file_size();
  }
  EXPECT_LT(bytes, 30u << 20);
}

// The acceptance floor: the trained drafter on held-out prompts keeps a
// mean acceptance length far above what a random drafter of the same
// architecture gets with the same target, and speculation stays lossless.
TEST_F(BundledModelTest, TrainedDrafterBeatsRandomDrafterLosslessly) {
  const SpecRun trained_p1 = Speculate(kModels + "/drafter", 16, 1);
  const SpecRun trained_p2 = Speculate(kModels + "/drafter", 16, 2);

  auto config = LoadDrafterConfig(kModels + "/drafter");
  ASSERT_TRUE(config.ok()) << config.status();
  auto random = TrainableDrafter::Init(*config, 99);
  ASSERT_TRUE(random.ok()) << random.status();
  const std::string dir = ::testing::TempDir() + "/random_drafter";
  ASSERT_TRUE(random->Export(dir, at::kFloat, {}).ok());
  const SpecRun untrained = Speculate(dir, 16, 1);
  std::filesystem::remove_all(dir);

  RecordProperty("tau_trained_p1", std::to_string(trained_p1.tau));
  RecordProperty("tau_trained_p2", std::to_string(trained_p2.tau));
  RecordProperty("tau_random_p1", std::to_string(untrained.tau));
  // Measured when the pair was trained: see checkpoints/tiny/drafter/eval.json
  // and MODEL_CARD.md beside it. The floor sits well below the measured value
  // and far above the random drafter's.
  EXPECT_GE(trained_p1.tau, kAcceptanceFloor);
  EXPECT_GE(trained_p2.tau, kAcceptanceFloor);
  EXPECT_LT(untrained.tau, 1.05);
  EXPECT_GT(trained_p1.tau - untrained.tau, 0.1);
}

// The lookup-seeded drafter bundled beside the shipped one
// (checkpoints/tiny/drafter-seeded; docs/log/2026-12-06-results-notebook.md, "a
// lookup-seeded drafter"): its config asks for seeds, the engine gives them, it
// stays lossless, and on these prompts it accepts more than the shipped drafter
// at W=16, K=1.
TEST_F(BundledModelTest, SeededDrafterIsLosslessAndAcceptsMore) {
  auto config = LoadDrafterConfig(kModels + "/drafter-seeded");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->lookup_seed_ngram, 2);
  const SpecRun seeded = Speculate(kModels + "/drafter-seeded", 16, 1);
  const SpecRun shipped = Speculate(kModels + "/drafter", 16, 1);
  RecordProperty("tau_seeded_p1", std::to_string(seeded.tau));
  EXPECT_GE(seeded.tau, kSeededAcceptanceFloor);
  EXPECT_GT(seeded.tau, shipped.tau);
}

}  // namespace
}  // namespace dedit::training
