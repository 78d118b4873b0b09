#include "common/engine/speculative_engine.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/model/cpu/cpu_product_pool.h"
#include "common/model/local_backends.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"

namespace dedit {
namespace {

using testing::GreedyReference;
using ::testing::HasSubstr;
using testing::MakeTinyPair;
using testing::RandomPrompt;

// A drafter whose proposals come from a function: oracles, constant and
// broken drafters. It ignores context (still a sink so the verifier can
// stream to it).
class ScriptedDrafter : public Drafter, public ContextSink {
 public:
  using Script =
      std::function<absl::StatusOr<DraftResult>(const DraftRequest&)>;
  ScriptedDrafter(int block_size, Script script)
      : block_size_(block_size), script_(std::move(script)) {}
  absl::StatusOr<std::vector<DraftResult>> Draft(
      const std::vector<DraftRequest>& requests) override {
    ++calls;
    std::vector<DraftResult> out;
    for (const DraftRequest& r : requests) {
      auto d = script_(r);
      if (!d.ok()) return d.status();
      out.push_back(std::move(*d));
    }
    return out;
  }
  absl::Status Release(SequenceId) override { return absl::OkStatus(); }
  int block_size() const override { return block_size_; }
  absl::Status OnContext(SequenceId, int64_t, const at::Tensor&) override {
    return absl::OkStatus();
  }
  int calls = 0;

 private:
  int block_size_;
  Script script_;
};

// Drafts the greedy reference `ref` (the output after a prompt of
// `prompt_len` tokens), every output index divisible by `corrupt_every`
// (0 = none) made wrong; K identical passes, all confident.
ScriptedDrafter::Script CorruptedOracle(const std::vector<int32_t>* ref,
                                        int64_t prompt_len, int corrupt_every) {
  return [ref, prompt_len,
          corrupt_every](const DraftRequest& r) -> absl::StatusOr<DraftResult> {
    DraftPass pass;
    for (int j = 1; j < r.window; ++j) {
      // Slot j proposes the token at position start + j, i.e. output index
      // start + j - prompt_len (the bonus is output start - prompt_len).
      const int64_t idx = r.start + j - prompt_len;
      int32_t t = (*ref)[idx];
      if (corrupt_every > 0 && idx % corrupt_every == 0) t = (t + 1) % 128;
      pass.tokens.push_back(t);
      pass.confidences.push_back(1.0f);
    }
    DraftResult d;
    d.passes.assign(r.passes, pass);
    return d;
  };
}

SpeculativeEngine::Options EngineOptions(const TinyModelSpec& spec) {
  SpeculativeEngine::Options o;
  o.vocab_size = spec.target.vocab_size;
  o.max_context = spec.target.max_position_embeddings;
  return o;
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = DefaultTinySpec();
    pair_ = MakeTinyPair(spec_, 31);
  }
  // The target's greedy output for each prompt.
  std::vector<std::vector<int32_t>> References(
      const std::vector<std::vector<int32_t>>& prompts, int n) const {
    std::vector<std::vector<int32_t>> out;
    for (const auto& p : prompts) {
      out.push_back(GreedyReference(*pair_->target, p, n));
    }
    return out;
  }

  // One greedy request per prompt, `n` new tokens at window `w` (the tests
  // then set each one's method and passes).
  static std::vector<GenerationRequest> Requests(
      const std::vector<std::vector<int32_t>>& prompts, int n, int w) {
    std::vector<GenerationRequest> reqs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      reqs[i].prompt = prompts[i];
      reqs[i].max_new_tokens = n;
      reqs[i].window = w;
    }
    return reqs;
  }

  // Generates `reqs` as one batch and checks every output against the
  // target's greedy `reference` token for token (the losslessness
  // invariant), each failure naming `label` and the sequence. Returns the
  // results for further checks, none if the batch itself failed.
  static std::vector<GenerationResult> GenerateLossless(
      SpeculativeEngine& engine, const std::vector<GenerationRequest>& reqs,
      const std::vector<std::vector<int32_t>>& reference,
      const std::string& label) {
    auto results = engine.Generate(reqs);
    EXPECT_TRUE(results.ok()) << label << ": " << results.status();
    if (!results.ok()) return {};
    for (size_t i = 0; i < results->size(); ++i) {
      const GenerationResult& r = (*results)[i];
      EXPECT_TRUE(r.status.ok()) << label << " seq " << i << ": " << r.status;
      EXPECT_EQ(r.tokens, reference[i]) << label << " seq " << i;
    }
    return *std::move(results);
  }

  TinyModelSpec spec_;
  std::unique_ptr<testing::TinyPair> pair_;
};

// docs/ARCHITECTURE.md §1 invariant: at T = 0 the output equals greedy
// target-only decoding for every W, K and batch composition, with a random
// drafter.
TEST_F(EngineTest, LosslessForEveryWindowAndPassCount) {
  const std::vector<std::vector<int32_t>> prompts = {
      RandomPrompt(3, 128, 1), RandomPrompt(11, 128, 2),
      RandomPrompt(29, 128, 3), RandomPrompt(64, 128, 4)};
  const int kNew = 40;
  const std::vector<std::vector<int32_t>> reference = References(prompts, kNew);
  LocalDrafter drafter(pair_->drafter.get());
  LocalVerifier verifier(pair_->target.get(), &drafter);
  SpeculativeEngine engine(&verifier, &drafter, EngineOptions(spec_));
  for (int w : {1, 4, 16, 32}) {
    for (int k : {1, 2, 3, 4}) {
      std::vector<GenerationRequest> reqs = Requests(prompts, kNew, w);
      for (size_t i = 0; i < reqs.size(); ++i) {
        // Mixed batch: the sequences disagree on K.
        reqs[i].passes = i == 0 ? k : 1 + (k + static_cast<int>(i)) % 4;
      }
      const std::vector<GenerationResult> results = GenerateLossless(
          engine, reqs, reference, absl::StrCat("W=", w, " K=", k));
      ASSERT_EQ(results.size(), prompts.size());
      for (size_t i = 0; i < prompts.size(); ++i) {
        const GenerationResult& r = results[i];
        EXPECT_EQ(r.finish, FinishReason::kLength);
        for (const RoundRecord& round : r.rounds) {
          EXPECT_LE(round.window, w);
          if (round.window >= 2) {
            EXPECT_EQ(round.edits.size(),
                      static_cast<size_t>(reqs[i].passes - 1));
          }
        }
      }
      // Nothing leaks: every sequence was released on both sides.
      EXPECT_EQ(pair_->target->num_sequences(), 0u);
      EXPECT_EQ(pair_->drafter->num_sequences(), 0u);
    }
  }
}

// Failover (router/stream_progress.h): a stream re-prefilled with its
// prompt and the first k tokens it emitted continues with exactly the
// tokens the uninterrupted run produced next, greedy (prefill and decode
// rows sum the same: common/model/cpu/cpu_panels.h) and seeded sampling
// (each draw is a function of (seed, position): common/model/sampling.h),
// whatever the window and passes of either run. So is a seeded sampled
// stream's output the same for every window.
TEST_F(EngineTest, ResumedFromEmittedTokensContinuesIdentically) {
  const std::vector<int32_t> prompt = RandomPrompt(17, 128, 9);
  const int kNew = 40;
  LocalDrafter drafter(pair_->drafter.get());
  LocalVerifier verifier(pair_->target.get(), &drafter);
  SpeculativeEngine engine(&verifier, &drafter, EngineOptions(spec_));
  for (const float temperature : {0.0f, 0.8f}) {
    GenerationRequest whole;
    whole.prompt = prompt;
    whole.max_new_tokens = kNew;
    whole.window = 1;
    whole.passes = 0;
    whole.sampling = {temperature, 0, 1.0f, 1234, true};
    auto uninterrupted = engine.Generate({whole});
    ASSERT_TRUE(uninterrupted.ok()) << uninterrupted.status();
    const std::vector<int32_t> expected = (*uninterrupted)[0].tokens;
    ASSERT_EQ(expected.size(), static_cast<size_t>(kNew));
    for (const int w : {1, 8}) {
      for (const int k : {0, 1, 13, 27}) {
        GenerationRequest resumed = whole;
        resumed.prompt.insert(resumed.prompt.end(), expected.begin(),
                              expected.begin() + k);
        resumed.max_new_tokens = kNew - k;
        resumed.window = w;
        resumed.passes = w > 1 ? 2 : 0;
        auto rest = engine.Generate({resumed});
        ASSERT_TRUE(rest.ok()) << rest.status();
        EXPECT_EQ((*rest)[0].tokens,
                  std::vector<int32_t>(expected.begin() + k, expected.end()))
            << "T=" << temperature << " W=" << w << " resumed after " << k;
      }
    }
  }
  EXPECT_EQ(pair_->target->num_sequences(), 0u);
  EXPECT_EQ(pair_->drafter->num_sequences(), 0u);
}

// With the few-row products split across helper threads (--product_threads
// 2, common/model/cpu/cpu_product_pool.h) the rounds stay lossless: verify and
// drafter blocks take the split path, the greedy reference is one-row decoding.
TEST_F(EngineTest, LosslessWithProductThreads) {
  const std::vector<std::vector<int32_t>> prompts = {RandomPrompt(5, 128, 11),
                                                     RandomPrompt(40, 128, 12),
                                                     RandomPrompt(17, 128, 13)};
  const int kNew = 32;
  const std::vector<std::vector<int32_t>> reference = References(prompts, kNew);
  SetCpuProductThreads(2);
  absl::Cleanup off = [] { SetCpuProductThreads(1); };
  LocalDrafter drafter(pair_->drafter.get());
  LocalVerifier verifier(pair_->target.get(), &drafter);
  SpeculativeEngine engine(&verifier, &drafter, EngineOptions(spec_));
  for (int w : {4, 16}) {
    std::vector<GenerationRequest> reqs = Requests(prompts, kNew, w);
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].passes = 1 + static_cast<int>(i) % 3;
    }
    GenerateLossless(engine, reqs, reference, absl::StrCat("W=", w));
  }
  // The split path ran (this thread's pool took products).
  ASSERT_NE(CpuProductPool::ForThisThread(), nullptr);
  EXPECT_GT(CpuProductPool::ForThisThread()->runs(), 0);
}

// Drafts cut at their first unconfident slot (min_draft_confidence), with
// back-off: the random drafter's confidences are low and varied, so the
// thresholds give whole drafts, partial cuts and drafts cut to nothing.
TEST_F(EngineTest, ConfidentDraftsAreLossless) {
  const std::vector<std::vector<int32_t>> prompts = {RandomPrompt(5, 128, 11),
                                                     RandomPrompt(17, 128, 12),
                                                     RandomPrompt(33, 128, 13)};
  const int kNew = 40;
  const std::vector<std::vector<int32_t>> reference = References(prompts, kNew);
  int64_t cut = 0, skipped = 0, drafted = 0;
  for (double c : {0.005, 0.02, 0.05, 0.9}) {
    LocalDrafter drafter(pair_->drafter.get());
    LocalVerifier verifier(pair_->target.get(), &drafter);
    SpeculativeEngine::Options o = EngineOptions(spec_);
    o.speculation.min_draft_confidence = c;
    SpeculativeEngine engine(&verifier, &drafter, o);
    for (int w : {4, 16}) {
      std::vector<GenerationRequest> reqs = Requests(prompts, kNew, w);
      for (size_t i = 0; i < reqs.size(); ++i) {
        reqs[i].passes = 1 + static_cast<int>(i) % 3;
        // A mixed batch: the model method and the hybrid.
        reqs[i].method = i == 1 ? DraftMethod::kHybrid : DraftMethod::kModel;
      }
      const std::vector<GenerationResult> results = GenerateLossless(
          engine, reqs, reference, absl::StrCat("C=", c, " W=", w));
      ASSERT_EQ(results.size(), prompts.size());
      for (const GenerationResult& r : results) {
        const AcceptanceSummary s = Summarize(r.rounds);
        cut += s.cut_rounds;
        skipped += s.skipped_rounds;
        drafted += s.drafted_rounds;
      }
      EXPECT_EQ(pair_->target->num_sequences(), 0u);
      EXPECT_EQ(pair_->drafter->num_sequences(), 0u);
    }
  }
  // The thresholds did cut, skip and keep drafts.
  EXPECT_GT(cut, 0);
  EXPECT_GT(skipped, 0);
  EXPECT_GT(drafted, 0);
}

// An oracle drafter that knows the greedy continuation exercises full
// acceptance (acc = W - 1) and partial acceptance at chosen slots.
TEST_F(EngineTest, LosslessWithOracleAndCorruptedOracleDrafters) {
  const std::vector<int32_t> prompt = RandomPrompt(9, 128, 7);
  const int kNew = 60;
  const std::vector<int32_t> ref =
      GreedyReference(*pair_->target, prompt, kNew + 40);
  for (int corrupt_every : {0, 5, 2}) {
    ScriptedDrafter oracle(
        32, CorruptedOracle(&ref, static_cast<int64_t>(prompt.size()),
                            corrupt_every));
    LocalVerifier verifier(pair_->target.get(), &oracle);
    SpeculativeEngine engine(&verifier, &oracle, EngineOptions(spec_));
    GenerationRequest req;
    req.prompt = prompt;
    req.max_new_tokens = kNew;
    req.window = 8;
    req.passes = 2;
    auto results = engine.Generate({req});
    ASSERT_TRUE(results.ok());
    const GenerationResult& r = (*results)[0];
    EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + kNew));
    AcceptanceSummary s = Summarize(r.rounds);
    if (corrupt_every == 0) {
      // Every round accepts all 7 drafts except where max_tokens shrank W.
      EXPECT_GT(s.mean_acceptance_length(), 7.0);
      EXPECT_EQ(s.accepted_per_position[6], s.drafted_rounds - 1);
    } else {
      EXPECT_LT(s.mean_acceptance_length(), 7.0);
      EXPECT_GT(s.mean_acceptance_length(), 1.0);
    }
    // Two identical passes: every edit is "unchanged".
    EXPECT_EQ(s.edit_outcomes[0][static_cast<int>(EditOutcome::kUnchanged)],
              s.drafted_rounds);
  }
}

// SpeculationOptions::verify_chunk: drafts verified a few rows at a time, the
// rest of a draft in the next round when all its verified tokens were accepted.
// The output is the target's, the drafter is asked exactly as often as
// when whole drafts are verified, and no verified block exceeds the chunk.
TEST_F(EngineTest, ChunkedVerificationIsLosslessAndDraftsAsOften) {
  const std::vector<int32_t> prompt = RandomPrompt(9, 128, 7);
  const int kNew = 70;
  const std::vector<int32_t> ref =
      GreedyReference(*pair_->target, prompt, kNew + 40);
  for (int corrupt_every : {0, 5, 3, 2}) {
    int whole_requests = -1;
    for (int chunk : {0, 2, 3, 6, 16}) {
      int requests = 0;
      ScriptedDrafter oracle(
          32, [&, script =
                      CorruptedOracle(&ref, static_cast<int64_t>(prompt.size()),
                                      corrupt_every)](const DraftRequest& r) {
            ++requests;
            return script(r);
          });
      LocalVerifier verifier(pair_->target.get(), &oracle);
      SpeculativeEngine::Options o = EngineOptions(spec_);
      o.speculation.verify_chunk = chunk;
      SpeculativeEngine engine(&verifier, &oracle, o);
      GenerationRequest req;
      req.prompt = prompt;
      req.max_new_tokens = kNew;
      req.window = 16;
      req.passes = 2;
      auto results = engine.Generate({req});
      ASSERT_TRUE(results.ok()) << results.status();
      const GenerationResult& r = (*results)[0];
      const std::string where =
          absl::StrCat("corrupt every ", corrupt_every, ", chunk ", chunk);
      EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + kNew))
          << where;
      if (whole_requests < 0) whole_requests = requests;
      EXPECT_EQ(requests, whole_requests) << where;
      const AcceptanceSummary s = Summarize(r.rounds);
      for (const RoundRecord& round : r.rounds) {
        if (chunk > 0) EXPECT_LE(round.window, chunk) << where;
      }
      // The rest of a draft is verified only when the chunk's drafts and
      // the next one are right: `chunk` right tokens in a row.
      const bool reuses = chunk > 0 && chunk < 16 &&
                          (corrupt_every == 0 || chunk < corrupt_every);
      EXPECT_EQ(s.reused_rounds > 0, reuses) << where;
      EXPECT_EQ(s.drafted_rounds - s.reused_rounds, requests) << where;
      // Two identical passes: every edit over the verified slots is
      // "unchanged" (a reused rest has one pass, no edit).
      EXPECT_EQ(s.edit_outcomes[0][static_cast<int>(EditOutcome::kUnchanged)],
                requests)
          << where;
      EXPECT_EQ(pair_->target->num_sequences(), 0u);
    }
  }
  // The model drafter on a mixed batch (model K = 3, hybrid K = 2 and
  // n-gram requests): only the model's drafts are chunked.
  const std::vector<std::vector<int32_t>> prompts = {RandomPrompt(5, 128, 11),
                                                     RandomPrompt(17, 128, 12),
                                                     RandomPrompt(33, 128, 13)};
  const std::vector<std::vector<int32_t>> reference = References(prompts, 40);
  LocalDrafter drafter(pair_->drafter.get());
  LocalVerifier verifier(pair_->target.get(), &drafter);
  SpeculativeEngine::Options o = EngineOptions(spec_);
  o.speculation.verify_chunk = 3;
  SpeculativeEngine engine(&verifier, &drafter, o);
  std::vector<GenerationRequest> reqs = Requests(prompts, 40, 16);
  const DraftMethod methods[] = {DraftMethod::kModel, DraftMethod::kHybrid,
                                 DraftMethod::kNgram};
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].passes = 3 - static_cast<int>(i);
    reqs[i].method = methods[i];
  }
  const std::vector<GenerationResult> results =
      GenerateLossless(engine, reqs, reference, "mixed batch, chunk 3");
  ASSERT_EQ(results.size(), 3u);
  bool ngram_whole = false;
  for (const RoundRecord& round : results[2].rounds) {
    ngram_whole |= round.window > 3;
  }
  EXPECT_TRUE(ngram_whole) << "an n-gram block was chunked";
  for (const RoundRecord& round : results[0].rounds) {
    EXPECT_LE(round.window, 3);
  }
  EXPECT_EQ(pair_->target->num_sequences(), 0u);
  EXPECT_EQ(pair_->drafter->num_sequences(), 0u);
}

// Broken drafters cost speed, never correctness: failures, wrong lengths,
// out-of-vocabulary ids and NaN confidences all fall back to target-only.
TEST_F(EngineTest, BrokenDraftersFallBackAndStayLossless) {
  const std::vector<int32_t> prompt = RandomPrompt(12, 128, 8);
  const int kNew = 30;
  const std::vector<int32_t> ref =
      GreedyReference(*pair_->target, prompt, kNew);
  std::vector<ScriptedDrafter::Script> scripts = {
      [](const DraftRequest&) -> absl::StatusOr<DraftResult> {
        return absl::UnavailableError("drafter down");
      },
      [](const DraftRequest& r) -> absl::StatusOr<DraftResult> {
        DraftResult d;
        d.passes.push_back({std::vector<int32_t>(r.window + 3, 1), {}});
        return d;
      },
      [](const DraftRequest& r) -> absl::StatusOr<DraftResult> {
        DraftResult d;
        d.passes.push_back({std::vector<int32_t>(r.window - 1, 100000),
                            std::vector<float>(r.window - 1, NAN)});
        return d;
      },
      [](const DraftRequest&) -> absl::StatusOr<DraftResult> {
        return DraftResult{};  // no passes at all
      },
  };
  for (size_t s = 0; s < scripts.size(); ++s) {
    ScriptedDrafter broken(32, scripts[s]);
    LocalVerifier verifier(pair_->target.get(), &broken);
    SpeculativeEngine engine(&verifier, &broken, EngineOptions(spec_));
    GenerationRequest req;
    req.prompt = prompt;
    req.max_new_tokens = kNew;
    req.window = 16;
    req.passes = 3;
    auto results = engine.Generate({req, req});
    ASSERT_TRUE(results.ok());
    for (const GenerationResult& r : *results) {
      EXPECT_TRUE(r.status.ok()) << r.status;
      EXPECT_EQ(r.tokens, ref) << "script " << s;
      AcceptanceSummary sum = Summarize(r.rounds);
      EXPECT_EQ(sum.fallback_rounds, 1) << "script " << s;
      EXPECT_EQ(sum.drafted_rounds, 0);
    }
    EXPECT_EQ(pair_->target->num_sequences(), 0u);
  }
}

// Prompts that repeat themselves, so that lookups find matches.
std::vector<std::vector<int32_t>> RepeatingPrompts(int n, uint64_t seed) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = RandomPrompt(6 + i, 128, seed + i);
    std::vector<int32_t> twice = p;
    twice.insert(twice.end(), p.begin(), p.end());
    twice.push_back(p[0]);
    prompts.push_back(twice);
  }
  return prompts;
}

// The n-gram method (prompt lookup, no model) is a drafter like any other:
// lossless for every W, in a batch mixed with model-drafted and target-only
// requests, and its short blocks (fewer than W-1 proposals, or none) are
// verified as they are.
TEST_F(EngineTest, NgramMethodIsLosslessInAMixedBatch) {
  const std::vector<std::vector<int32_t>> prompts = RepeatingPrompts(4, 40);
  const int kNew = 48;
  const std::vector<std::vector<int32_t>> reference = References(prompts, kNew);
  LocalDrafter drafter(pair_->drafter.get());
  LocalVerifier verifier(pair_->target.get(), &drafter);
  SpeculativeEngine engine(&verifier, &drafter, EngineOptions(spec_));
  int64_t drafted = 0, short_blocks = 0;
  for (int w : {2, 4, 8, 32}) {
    std::vector<GenerationRequest> reqs = Requests(prompts, kNew, w);
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].method = i % 2 == 0 ? DraftMethod::kNgram : DraftMethod::kModel;
      reqs[i].passes = i == 3 ? 0 : 1;  // one target-only request in the mix
    }
    const std::vector<GenerationResult> results =
        GenerateLossless(engine, reqs, reference, absl::StrCat("W=", w));
    ASSERT_EQ(results.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const GenerationResult& r = results[i];
      const AcceptanceSummary sum = Summarize(r.rounds);
      EXPECT_EQ(sum.fallback_rounds, 0);
      if (reqs[i].method != DraftMethod::kNgram) continue;
      for (const RoundRecord& round : r.rounds) {
        EXPECT_LE(round.window, w);
        EXPECT_TRUE(round.edits.empty());
        if (round.window >= 2) ++drafted;
        if (round.window < w) ++short_blocks;
      }
    }
    EXPECT_EQ(pair_->target->num_sequences(), 0u);
    EXPECT_EQ(pair_->drafter->num_sequences(), 0u);
  }
  // The repeated prompts give the lookup something to find, and a random
  // target's output gives it misses: both kinds of round were exercised.
  EXPECT_GT(drafted, 0);
  EXPECT_GT(short_blocks, 0);
}

// A lookup-seeded drafter (DrafterConfig::lookup_seed_ngram): every model
// request carries the prompt lookup's proposal as P1's input, computed
// from the tokens the engine knows, at most W-1 of them; a drafter that
// is not seeded gets none. Output stays the target's, with a seeded
// random DEdit drafter too.
TEST_F(EngineTest, LookupSeededDrafterGetsTheLookupAndStaysLossless) {
  const std::vector<std::vector<int32_t>> prompts = RepeatingPrompts(4, 60);
  const int kNew = 40;
  const std::vector<std::vector<int32_t>> reference = References(prompts, kNew);
  // The scripted drafter proposes exactly its seed: the rounds then accept
  // what the lookup would (its window and tokens come from the request).
  class SeededScript : public ScriptedDrafter {
   public:
    using ScriptedDrafter::ScriptedDrafter;
    int lookup_seed_ngram() const override { return n; }
    int n = 1;  // the random target's output recurs in single tokens
  };
  int64_t seeded = 0, requests = 0;
  SeededScript scripted(32, [&](const DraftRequest& r) {
    ++requests;
    EXPECT_LE(r.seed.size(), static_cast<size_t>(r.window - 1));
    if (!r.seed.empty()) ++seeded;
    DraftPass pass;
    pass.tokens = r.seed;
    pass.tokens.resize(r.window - 1, 0);
    pass.confidences.assign(r.window - 1, 1.0f);
    return DraftResult{{pass}};
  });
  LocalVerifier scripted_verifier(pair_->target.get(), &scripted);
  SpeculativeEngine engine(&scripted_verifier, &scripted, EngineOptions(spec_));
  auto model_requests = [&](int w) {
    std::vector<GenerationRequest> reqs = Requests(prompts, kNew, w);
    for (GenerationRequest& r : reqs) r.passes = 1;
    return reqs;
  };
  int64_t accepted = 0;
  for (int w : {2, 8}) {
    for (const GenerationResult& r :
         GenerateLossless(engine, model_requests(w), reference,
                          absl::StrCat("scripted W=", w))) {
      accepted += Summarize(r.rounds).accepted_tokens;
    }
  }
  // The repeating prompts give the lookup matches, and copies of them are
  // accepted.
  EXPECT_GT(seeded, 0);
  EXPECT_GT(accepted, 0);
  scripted.n = 0;
  seeded = 0;
  requests = 0;
  GenerateLossless(engine, model_requests(8), reference, "unseeded");
  EXPECT_GT(requests, 0);
  EXPECT_EQ(seeded, 0);

  // A random DEdit drafter whose config asks for seeds.
  TinyModelSpec spec = spec_;
  spec.drafter.lookup_seed_ngram = 2;
  std::unique_ptr<testing::TinyPair> pair = MakeTinyPair(spec, 31);
  ASSERT_EQ(pair->drafter->config().lookup_seed_ngram, 2);
  LocalDrafter drafter(pair->drafter.get());
  EXPECT_EQ(drafter.lookup_seed_ngram(), 2);
  LocalVerifier verifier(pair->target.get(), &drafter);
  SpeculativeEngine seeded_engine(&verifier, &drafter, EngineOptions(spec));
  for (int w : {2, 8, 32}) {
    for (int k : {1, 3}) {
      std::vector<GenerationRequest> reqs = Requests(prompts, kNew, w);
      for (GenerationRequest& r : reqs) r.passes = k;
      GenerateLossless(seeded_engine, reqs, reference,
                       absl::StrCat("seeded DEdit W=", w, " K=", k));
    }
  }
  EXPECT_EQ(pair->drafter->num_sequences(), 0u);

  // Trust in the seed (seed_logit_bonus): at the largest bonus every pass
  // of the drafter keeps its seed where it has one (the edits read only the
  // pass before, yet do not undo the copy); lossless with and without it.
  // (A random drafter with tied embeddings copies much of its input anyway;
  // DrafterEquivalenceTest checks the bonus's exact logits.)
  spec.drafter.lookup_seed_ngram = 1;
  class Counting : public Drafter {
   public:
    explicit Counting(Drafter* inner) : inner_(inner) {}
    absl::StatusOr<std::vector<DraftResult>> Draft(
        const std::vector<DraftRequest>& requests) override {
      auto results = inner_->Draft(requests);
      if (!results.ok()) return results;
      for (size_t i = 0; i < requests.size(); ++i) {
        const std::vector<int32_t>& seed = requests[i].seed;
        for (const DraftPass& pass : (*results)[i].passes) {
          for (size_t j = 0; j < seed.size(); ++j) {
            ++slots;
            kept += pass.tokens[j] == seed[j];
          }
        }
      }
      return results;
    }
    absl::Status Release(SequenceId sequence) override {
      return inner_->Release(sequence);
    }
    int block_size() const override { return inner_->block_size(); }
    int lookup_seed_ngram() const override {
      return inner_->lookup_seed_ngram();
    }
    int64_t slots = 0, kept = 0;

   private:
    Drafter* inner_;
  };
  for (double bonus : {0.0, kMaxSeedLogitBonus}) {
    TinyModelSpec s = spec;
    s.drafter.seed_logit_bonus = bonus;
    std::unique_ptr<testing::TinyPair> p = MakeTinyPair(s, 31);
    ASSERT_EQ(p->drafter->config().seed_logit_bonus, bonus);
    LocalDrafter local(p->drafter.get());
    Counting counting(&local);
    LocalVerifier v(p->target.get(), &local);
    SpeculativeEngine e(&v, &counting, EngineOptions(s));
    for (int k : {1, 3}) {
      std::vector<GenerationRequest> reqs = Requests(prompts, kNew, 8);
      for (GenerationRequest& r : reqs) r.passes = k;
      GenerateLossless(e, reqs, reference,
                       absl::StrCat("seeded DEdit bonus ", bonus, " K=", k));
    }
    ASSERT_GT(counting.slots, 100) << bonus;
    if (bonus > 0) EXPECT_EQ(counting.kept, counting.slots);
  }
}

// The hybrid method: each round takes the prompt lookup's block when the
// recent tokens recur and the model drafter's otherwise, in a batch that
// mixes it with the other methods; lossless for every W and K.
TEST_F(EngineTest, HybridMethodIsLosslessAndDraftsBothWays) {
  const std::vector<std::vector<int32_t>> prompts = RepeatingPrompts(4, 80);
  const int kNew = 40;
  const std::vector<std::vector<int32_t>> reference = References(prompts, kNew);
  LocalDrafter drafter(pair_->drafter.get());
  LocalVerifier verifier(pair_->target.get(), &drafter);
  SpeculativeEngine engine(&verifier, &drafter, EngineOptions(spec_));
  int64_t lookup_rounds = 0, model_rounds = 0;
  for (int w : {2, 8, 16}) {
    for (int k : {1, 3}) {
      std::vector<GenerationRequest> reqs = Requests(prompts, kNew, w);
      for (size_t i = 0; i < reqs.size(); ++i) {
        reqs[i].passes = k;
        reqs[i].method = i == 3 ? DraftMethod::kModel : DraftMethod::kHybrid;
      }
      reqs[2].method = DraftMethod::kNgram;
      reqs[2].passes = 1;
      const std::vector<GenerationResult> results = GenerateLossless(
          engine, reqs, reference, absl::StrCat("W=", w, " K=", k));
      ASSERT_EQ(results.size(), prompts.size());
      for (size_t i = 0; i < prompts.size(); ++i) {
        const GenerationResult& r = results[i];
        if (reqs[i].method != DraftMethod::kHybrid) {
          EXPECT_EQ(Summarize(r.rounds).lookup_rounds, 0);
          continue;
        }
        for (const RoundRecord& round : r.rounds) {
          EXPECT_LE(round.window, w);
          EXPECT_FALSE(round.fallback);
          if (round.window < 2) continue;
          // A lookup block has one pass; the model's has K.
          EXPECT_EQ(round.edits.size(),
                    round.looked_up ? 0u : static_cast<size_t>(k - 1));
          ++(round.looked_up ? lookup_rounds : model_rounds);
        }
      }
      EXPECT_EQ(pair_->target->num_sequences(), 0u);
      EXPECT_EQ(pair_->drafter->num_sequences(), 0u);
    }
  }
  EXPECT_GT(lookup_rounds, 0);
  EXPECT_GT(model_rounds, 0);
}

// A lookup hit costs no drafter call, and a broken model drafter does not
// stop the lookups: after its failure the sequence's rounds are lookups or
// target-only, and the output is still the target's.
TEST_F(EngineTest, HybridKeepsLookingUpAfterTheModelDrafterFails) {
  ScriptedDrafter broken(16, [](const DraftRequest&) {
    return absl::StatusOr<DraftResult>(absl::InternalError("drafter down"));
  });
  LocalVerifier verifier(pair_->target.get(), &broken);
  SpeculativeEngine engine(&verifier, &broken, EngineOptions(spec_));
  // A prompt without repeats: the first round's lookup misses and the
  // model is asked. The random target's greedy output soon cycles, which
  // later lookups find.
  GenerationRequest req;
  req.prompt = RandomPrompt(12, 128, 91);
  req.max_new_tokens = 48;
  req.window = 8;
  req.method = DraftMethod::kHybrid;
  auto results = engine.Generate({req});
  ASSERT_TRUE(results.ok()) << results.status();
  const GenerationResult& r = (*results)[0];
  EXPECT_EQ(r.tokens, GreedyReference(*pair_->target, req.prompt, 48));
  // The model was asked once, on the first round the lookup missed, and
  // never again; lookups went on after that round.
  EXPECT_EQ(broken.calls, 1);
  EXPECT_EQ(Summarize(r.rounds).fallback_rounds, 1);
  size_t failed_at = r.rounds.size();
  int lookups_after = 0;
  for (size_t i = 0; i < r.rounds.size(); ++i) {
    if (r.rounds[i].fallback) failed_at = i;
    if (i > failed_at && r.rounds[i].looked_up) ++lookups_after;
  }
  EXPECT_GT(lookups_after, 0);
  EXPECT_EQ(pair_->target->num_sequences(), 0u);
}

TEST_F(EngineTest, HybridMethodRejectsWindowsTheLookupCannotServe) {
  LocalDrafter drafter(pair_->drafter.get());
  LocalVerifier verifier(pair_->target.get(), &drafter);
  SpeculativeEngine::Options o = EngineOptions(spec_);
  o.speculation.ngram.max_window = 8;
  SpeculativeEngine engine(&verifier, &drafter, o);
  GenerationRequest req;
  req.prompt = {1, 2, 3};
  req.method = DraftMethod::kHybrid;
  req.window = 12;
  EXPECT_THAT(engine.Submit(req).status().message(),
              HasSubstr("largest window 8"));
  req.window = drafter.block_size() + 1;
  EXPECT_THAT(engine.Submit(req).status().message(), HasSubstr("block size"));
}

// The model drafter is fed context only for the sequences it may draft:
// target-only and n-gram requests cost it no features and no memory, and
// are not released on it. Output stays lossless for all of them.
TEST_F(EngineTest, OnlySequencesTheModelDraftsFeedTheDrafter) {
  class Recording : public Drafter, public ContextSink {
   public:
    explicit Recording(LocalDrafter* inner) : inner_(inner) {}
    absl::StatusOr<std::vector<DraftResult>> Draft(
        const std::vector<DraftRequest>& requests) override {
      return inner_->Draft(requests);
    }
    absl::Status Release(SequenceId id) override {
      released.insert(id);
      return inner_->Release(id);
    }
    int block_size() const override { return inner_->block_size(); }
    absl::Status OnContext(SequenceId id, int64_t start,
                           const at::Tensor& features) override {
      fed.insert(id);
      return inner_->OnContext(id, start, features);
    }
    std::set<SequenceId> fed, released;

   private:
    LocalDrafter* inner_;
  };
  LocalDrafter inner(pair_->drafter.get());
  Recording drafter(&inner);
  LocalVerifier verifier(pair_->target.get(), &drafter);
  SpeculativeEngine engine(&verifier, &drafter, EngineOptions(spec_));
  const int kNew = 24;
  std::vector<GenerationRequest> reqs(4);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt =
        RandomPrompt(9 + static_cast<int>(i), 128, 60 + static_cast<int>(i));
    reqs[i].max_new_tokens = kNew;
    reqs[i].window = 8;
  }
  reqs[1].passes = 0;                    // target-only
  reqs[2].method = DraftMethod::kNgram;  // prompt lookup
  reqs[3].window = 1;                    // target-only by window
  auto results = engine.Generate(reqs);
  ASSERT_TRUE(results.ok()) << results.status();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*results)[i].tokens,
              GreedyReference(*pair_->target, reqs[i].prompt, kNew))
        << "request " << i;
  }
  const std::vector<SequenceId> ids = {(*results)[0].id, (*results)[1].id};
  EXPECT_EQ(drafter.fed, std::set<SequenceId>{ids[0]});
  EXPECT_EQ(drafter.released, std::set<SequenceId>{ids[0]});
  EXPECT_EQ(pair_->drafter->num_sequences(), 0u);
  EXPECT_EQ(pair_->target->num_sequences(), 0u);
}

// SpeculationOptions::max_speculative_batch: rounds of more running sequences
// than the limit draft nothing (model and n-gram alike) and are counted as
// paused; once requests finish and the batch fits, the rest speculate
// again. Output is the target's greedy output throughout.
TEST_F(EngineTest, SpeculationPausesWhileTheBatchIsOverTheLimit) {
  class Counting : public Drafter, public ContextSink {
   public:
    explicit Counting(LocalDrafter* inner) : inner_(inner) {}
    absl::StatusOr<std::vector<DraftResult>> Draft(
        const std::vector<DraftRequest>& requests) override {
      batches.push_back(requests.size());
      return inner_->Draft(requests);
    }
    absl::Status Release(SequenceId id) override { return inner_->Release(id); }
    int block_size() const override { return inner_->block_size(); }
    absl::Status OnContext(SequenceId id, int64_t start,
                           const at::Tensor& features) override {
      return inner_->OnContext(id, start, features);
    }
    std::vector<size_t> batches;

   private:
    LocalDrafter* inner_;
  };
  for (int limit : {0, 2}) {
    LocalDrafter inner(pair_->drafter.get());
    Counting drafter(&inner);
    LocalVerifier verifier(pair_->target.get(), &drafter);
    SpeculativeEngine::Options o = EngineOptions(spec_);
    o.speculation.max_speculative_batch = limit;
    SpeculativeEngine engine(&verifier, &drafter, o);
    std::vector<GenerationRequest> reqs(4);
    const int new_tokens[] = {5, 6, 40, 40};
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].prompt =
          RandomPrompt(9 + static_cast<int>(i), 128, 80 + static_cast<int>(i));
      reqs[i].max_new_tokens = new_tokens[i];
      reqs[i].window = 6;
    }
    reqs[3].method = DraftMethod::kNgram;
    auto results = engine.Generate(reqs);
    ASSERT_TRUE(results.ok()) << results.status();
    for (size_t i = 0; i < reqs.size(); ++i) {
      const GenerationResult& r = (*results)[i];
      EXPECT_EQ(r.tokens,
                GreedyReference(*pair_->target, reqs[i].prompt, new_tokens[i]))
          << "limit " << limit << " request " << i;
      const AcceptanceSummary s = Summarize(r.rounds);
      if (limit == 0) {
        EXPECT_EQ(s.paused_rounds, 0);
        continue;
      }
      // While all four run (every round of the two short ones), nothing
      // is drafted; the long ones speculate once the short ones are done.
      EXPECT_GT(s.paused_rounds, 0) << i;
      for (const RoundRecord& round : r.rounds) {
        if (round.paused) EXPECT_EQ(round.window, 1);
      }
      if (i < 2) {
        // (The last round, with one token to go, is a decode step anyway.)
        EXPECT_EQ(s.paused_rounds, s.rounds - 1) << i;
        EXPECT_EQ(s.drafted_rounds, 0) << i;
      } else {
        EXPECT_GT(s.drafted_rounds, 0) << i;
      }
    }
    ASSERT_FALSE(drafter.batches.empty()) << "limit " << limit;
    for (size_t n : drafter.batches) {
      if (limit > 0) EXPECT_LE(n, static_cast<size_t>(limit));
    }
    if (limit == 0) EXPECT_EQ(drafter.batches.front(), 3u);
    EXPECT_EQ(pair_->drafter->num_sequences(), 0u);
    EXPECT_EQ(pair_->target->num_sequences(), 0u);
  }
}

// SpeculationOptions::adaptive_speculation: a drafter whose drafts are all
// wrong and slow (each Draft call costs 3 ms, 30 plain target steps) is asked
// less and less often, its request decoding plain rounds in between; an
// oracle keeps drafting every round after the first plain one. Both outputs
// are the target's. The engine reads a fake clock (Options::clock) on which
// every reading costs 0.1 ms and the slow drafter adds its 3 ms, so the
// policy sees the same timings on a loaded machine as on an idle one (with
// the real clock and a sleeping drafter, scheduling stalls on 2 busy cores
// made plain rounds look as slow as drafted ones).
TEST_F(EngineTest, AdaptiveSpeculationBacksOffADrafterThatDoesNotPay) {
  const std::vector<int32_t> prompt = RandomPrompt(9, 128, 7);
  const int kNew = 60;
  const std::vector<int32_t> ref =
      GreedyReference(*pair_->target, prompt, kNew + 40);
  for (int corrupt_every : {0, 1}) {
    double now = 0;
    const ScriptedDrafter::Script oracle = CorruptedOracle(
        &ref, static_cast<int64_t>(prompt.size()), corrupt_every);
    ScriptedDrafter drafter(
        32, [&](const DraftRequest& r) -> absl::StatusOr<DraftResult> {
          if (corrupt_every > 0) now += 3e-3;
          return oracle(r);
        });
    LocalVerifier verifier(pair_->target.get(), &drafter);
    SpeculativeEngine::Options o = EngineOptions(spec_);
    o.speculation.adaptive_speculation = true;
    o.clock = [&now] { return now += 1e-4; };
    SpeculativeEngine engine(&verifier, &drafter, o);
    GenerationRequest req;
    req.prompt = prompt;
    req.max_new_tokens = kNew;
    req.window = 8;
    auto results = engine.Generate({req});
    ASSERT_TRUE(results.ok()) << results.status();
    const GenerationResult& r = (*results)[0];
    EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + kNew));
    const AcceptanceSummary s = Summarize(r.rounds);
    // The first round after the prefill is plain: it measures one.
    ASSERT_FALSE(r.rounds.empty());
    EXPECT_TRUE(r.rounds[0].paused);
    EXPECT_EQ(r.rounds[0].window, 1);
    if (corrupt_every == 0) {
      EXPECT_EQ(s.paused_rounds, 1) << "rounds " << s.rounds;
      EXPECT_EQ(drafter.calls, s.drafted_rounds);
      EXPECT_GT(s.mean_acceptance_length(), 7.0);
    } else {
      // Probes after pauses of 1, 2, 4, 8, 16 and 16 rounds: 7 Draft calls
      // in 59 rounds (the prefill makes the first of the 60 tokens, and
      // every draft is wrong: one token a round). Every other round is a
      // pause but the last, whose one token left has nothing to draft.
      EXPECT_EQ(drafter.calls, 7) << "rounds " << s.rounds;
      EXPECT_EQ(s.rounds, kNew - 1);
      EXPECT_EQ(s.paused_rounds, s.rounds - drafter.calls - 1);
    }
  }
}

// Without any model drafter (a target-only deployment) the n-gram method
// still speculates, and its acceptance on text that repeats is what the
// lookup predicts: a target that copies its prompt accepts whole windows.
TEST_F(EngineTest, NgramMethodNeedsNoDrafterAndAcceptsRepeats) {
  const std::vector<int32_t> prompt = RandomPrompt(10, 128, 77);
  const int kNew = 64;
  const std::vector<int32_t> ref =
      GreedyReference(*pair_->target, prompt, kNew);
  LocalVerifier verifier(pair_->target.get(), nullptr);
  SpeculativeEngine engine(&verifier, nullptr, EngineOptions(spec_));
  GenerationRequest req;
  req.prompt = prompt;
  req.max_new_tokens = kNew;
  req.window = 8;
  req.method = DraftMethod::kNgram;
  auto first = engine.Generate({req});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)[0].tokens, ref);
  // Ask again with the answer already in the prompt: the continuation of
  // prompt + ref[0..32) is ref[32..), which the target produced right after
  // the same tokens, so lookups of recent n-grams often find it.
  GenerationRequest again = req;
  again.prompt.insert(again.prompt.end(), ref.begin(), ref.end());
  again.prompt.insert(again.prompt.end(), prompt.begin(), prompt.end());
  again.max_new_tokens = 32;
  auto second = engine.Generate({again});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)[0].tokens,
            GreedyReference(*pair_->target, again.prompt, 32));
  EXPECT_GT(Summarize((*second)[0].rounds).accepted_tokens, 0);
  EXPECT_EQ(pair_->target->num_sequences(), 0u);
}

TEST_F(EngineTest, NgramMethodRejectsEditPassesAndHugeWindows) {
  LocalVerifier verifier(pair_->target.get(), nullptr);
  SpeculativeEngine engine(&verifier, nullptr, EngineOptions(spec_));
  GenerationRequest req;
  req.prompt = {1, 2, 3};
  req.method = DraftMethod::kNgram;
  req.passes = 2;
  EXPECT_THAT(engine.Submit(req).status().message(), HasSubstr("one pass"));
  req.passes = 1;
  req.window = 65;
  EXPECT_THAT(engine.Submit(req).status().message(),
              HasSubstr("largest window 64"));
}

TEST_F(EngineTest, EditOutcomesCompareEachPassWithTheFinalProposal) {
  const std::vector<int32_t> prompt = RandomPrompt(6, 128, 9);
  const std::vector<int32_t> ref = GreedyReference(*pair_->target, prompt, 20);
  const int64_t plen = prompt.size();
  // Pass 1 right for 2 slots, pass 2 right for 5, pass 3 right for 3, final
  // (pass 4) right for 4: P1 extended, P2 shortened, P3 extended.
  const std::vector<int> right = {2, 5, 3, 4};
  ScriptedDrafter scripted(
      32, [&](const DraftRequest& r) -> absl::StatusOr<DraftResult> {
        DraftResult d;
        for (int k = 0; k < r.passes; ++k) {
          DraftPass pass;
          for (int j = 1; j < r.window; ++j) {
            int32_t t = ref[r.start + j - plen];
            if (j > right[k]) t = (t + 1) % 128;
            pass.tokens.push_back(t);
            pass.confidences.push_back(0.5f);
          }
          d.passes.push_back(pass);
        }
        return d;
      });
  LocalVerifier verifier(pair_->target.get(), &scripted);
  SpeculativeEngine engine(&verifier, &scripted, EngineOptions(spec_));
  GenerationRequest req;
  req.prompt = prompt;
  req.max_new_tokens = 1 + 5 * 3;  // three full rounds of tau = 5
  req.window = 8;
  req.passes = 4;
  auto results = engine.Generate({req});
  ASSERT_TRUE(results.ok());
  const GenerationResult& r = (*results)[0];
  EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + 16));
  ASSERT_EQ(r.rounds.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(r.rounds[i].accepted, 4);
    EXPECT_THAT(
        r.rounds[i].edits,
        ::testing::ElementsAre(EditOutcome::kExtended, EditOutcome::kShortened,
                               EditOutcome::kExtended));
  }
  // The last round's window shrank to the 5 tokens still wanted (4 draft
  // slots), so P2's 5 right tokens can no longer beat the final 4.
  EXPECT_EQ(r.rounds[2].window, 5);
  EXPECT_EQ(r.rounds[2].accepted, 4);
  EXPECT_THAT(
      r.rounds[2].edits,
      ::testing::ElementsAre(EditOutcome::kExtended, EditOutcome::kUnchanged,
                             EditOutcome::kExtended));
}

TEST_F(EngineTest, StopsOnEosStopIdsAndMaxTokens) {
  const std::vector<int32_t> prompt = RandomPrompt(10, 128, 10);
  const std::vector<int32_t> ref = GreedyReference(*pair_->target, prompt, 30);
  LocalDrafter drafter(pair_->drafter.get());
  LocalVerifier verifier(pair_->target.get(), &drafter);
  auto opts = EngineOptions(spec_);
  opts.eos_token_ids = {ref[7]};
  SpeculativeEngine engine(&verifier, &drafter, opts);
  const size_t first_eos =
      std::find(ref.begin(), ref.end(), ref[7]) - ref.begin();
  GenerationRequest req;
  req.prompt = prompt;
  req.max_new_tokens = 30;
  req.window = 16;
  req.passes = 2;
  GenerationRequest ignore = req;
  ignore.ignore_eos = true;
  GenerationRequest stop_id = ignore;
  stop_id.stop_token_ids = {ref[12]};
  const size_t first_stop =
      std::find(ref.begin(), ref.end(), ref[12]) - ref.begin();
  GenerationRequest short_req = ignore;
  short_req.max_new_tokens = 3;
  std::map<SequenceId, std::vector<int32_t>> streamed;
  auto record = [&](SequenceId id, const std::vector<int32_t>& t) {
    streamed[id].insert(streamed[id].end(), t.begin(), t.end());
  };
  std::vector<SequenceId> ids;
  for (const auto& r : {req, ignore, stop_id, short_req}) {
    ids.push_back(*engine.Submit(r, record));
  }
  while (!engine.idle()) ASSERT_TRUE(engine.Step().ok());
  std::map<SequenceId, GenerationResult> by_id;
  for (auto& r : engine.TakeFinished()) by_id[r.id] = std::move(r);
  EXPECT_EQ(by_id[ids[0]].tokens,
            std::vector<int32_t>(ref.begin(), ref.begin() + first_eos));
  EXPECT_EQ(by_id[ids[0]].finish, FinishReason::kStop);
  EXPECT_EQ(by_id[ids[0]].stop_token, ref[7]);
  EXPECT_EQ(by_id[ids[1]].tokens, ref);
  EXPECT_EQ(by_id[ids[1]].finish, FinishReason::kLength);
  EXPECT_EQ(by_id[ids[2]].tokens,
            std::vector<int32_t>(ref.begin(), ref.begin() + first_stop));
  EXPECT_EQ(by_id[ids[3]].tokens,
            std::vector<int32_t>(ref.begin(), ref.begin() + 3));
  for (SequenceId id : ids) EXPECT_EQ(streamed[id], by_id[id].tokens);
  EXPECT_EQ(pair_->target->num_sequences(), 0u);
  EXPECT_EQ(pair_->drafter->num_sequences(), 0u);
}

TEST_F(EngineTest, RejectsBadRequestsWithClearMessages) {
  LocalDrafter drafter(pair_->drafter.get());
  LocalVerifier verifier(pair_->target.get(), &drafter);
  SpeculativeEngine engine(&verifier, &drafter, EngineOptions(spec_));
  auto bad = [&](std::function<void(GenerationRequest&)> edit,
                 const char* msg) {
    GenerationRequest r;
    r.prompt = {1, 2, 3};
    edit(r);
    auto id = engine.Submit(r);
    ASSERT_FALSE(id.ok()) << msg;
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(id.status().message()), HasSubstr(msg));
  };
  bad([](GenerationRequest& r) { r.prompt.clear(); }, "prompt is empty");
  bad([](GenerationRequest& r) { r.prompt.push_back(128); },
      "outside the vocabulary");
  bad([](GenerationRequest& r) { r.max_new_tokens = 0; }, "max_tokens");
  bad([](GenerationRequest& r) { r.window = 33; }, "block size");
  bad([](GenerationRequest& r) { r.passes = -1; }, "passes");
  bad([](GenerationRequest& r) { r.prompt.assign(2048, 1); }, "context limit");
  bad([](GenerationRequest& r) { r.sampling.top_p = 0; }, "top_p");
  EXPECT_TRUE(engine.idle());
}

TEST_F(EngineTest, CancelReleasesBothSides) {
  LocalDrafter drafter(pair_->drafter.get());
  LocalVerifier verifier(pair_->target.get(), &drafter);
  SpeculativeEngine engine(&verifier, &drafter, EngineOptions(spec_));
  GenerationRequest req;
  req.prompt = RandomPrompt(5, 128, 3);
  req.max_new_tokens = 100;
  auto id = engine.Submit(req);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(engine.Step().ok());
  ASSERT_TRUE(engine.Step().ok());
  EXPECT_EQ(pair_->target->num_sequences(), 1u);
  EXPECT_EQ(pair_->drafter->num_sequences(), 1u);
  ASSERT_TRUE(engine.Cancel(*id).ok());
  EXPECT_TRUE(engine.idle());
  EXPECT_EQ(pair_->target->num_sequences(), 0u);
  EXPECT_EQ(pair_->drafter->num_sequences(), 0u);
  auto done = engine.TakeFinished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].finish, FinishReason::kCancelled);
  EXPECT_EQ(engine.Cancel(*id).code(), absl::StatusCode::kNotFound);
}

// T > 0: the joint distribution of the 2nd and 3rd generated tokens under
// speculative sampling matches the target's exact distribution (chi-square,
// p = 0.001) on a 6-token vocabulary, with a random drafter.
TEST(EngineSamplingTest, SpeculativeSamplingMatchesTargetDistribution) {
  TinyModelSpec spec = DefaultTinySpec();
  spec.target.vocab_size = 6;
  spec.drafter.layers.vocab_size = 6;
  spec.drafter.mask_token_id = 5;
  spec.drafter.block_size = 4;
  auto pair = MakeTinyPair(spec, 41);
  const float kTemperature = 2.0f;
  const std::vector<int32_t> prompt = {1, 4, 2, 0, 3};
  Qwen3Model& target = *pair->target;

  // Exact p(t1, t2, t3) by enumeration.
  auto next_probs = [&](const std::vector<int32_t>& tokens) {
    const SequenceId id = 999;
    EXPECT_TRUE(target.AddSequence(id).ok());
    auto r = target.Forward(
        {{id, tokens, 0, {static_cast<int>(tokens.size()) - 1}}});
    EXPECT_TRUE(target.RemoveSequence(id).ok());
    at::Tensor p = at::softmax(r->logits[0] / kTemperature, -1).to(at::kCPU);
    std::vector<double> out(6);
    for (int i = 0; i < 6; ++i) out[i] = p[i].item<double>();
    return out;
  };
  std::vector<double> exact(36, 0.0);  // (t2, t3)
  const std::vector<double> p1 = next_probs(prompt);
  for (int a = 0; a < 6; ++a) {
    std::vector<int32_t> s1 = prompt;
    s1.push_back(a);
    const std::vector<double> p2 = next_probs(s1);
    for (int b = 0; b < 6; ++b) {
      std::vector<int32_t> s2 = s1;
      s2.push_back(b);
      const std::vector<double> p3 = next_probs(s2);
      for (int c = 0; c < 6; ++c) exact[b * 6 + c] += p1[a] * p2[b] * p3[c];
    }
  }

  // A drafter that proposes uniformly random tokens: acceptance is frequent
  // on 6 tokens but unrelated to the target, the hardest case for exactness.
  std::mt19937_64 draft_rng(5);
  ScriptedDrafter drafter(
      4, [&](const DraftRequest& r) -> absl::StatusOr<DraftResult> {
        DraftResult d;
        for (int k = 0; k < r.passes; ++k) {
          DraftPass pass;
          for (int j = 1; j < r.window; ++j) {
            pass.tokens.push_back(static_cast<int32_t>(draft_rng() % 6));
            pass.confidences.push_back(1.0f / 6);
          }
          d.passes.push_back(pass);
        }
        return d;
      });
  LocalVerifier verifier(pair->target.get(), &drafter);
  auto opts = EngineOptions(spec);
  SpeculativeEngine engine(&verifier, &drafter, opts);
  const int kSamples = 6000;
  std::vector<int> counts(36, 0);
  int64_t accepted = 0;
  for (int batch = 0; batch < kSamples / 1000; ++batch) {
    std::vector<GenerationRequest> reqs(1000);
    for (int i = 0; i < 1000; ++i) {
      reqs[i].prompt = prompt;
      reqs[i].max_new_tokens = 4;  // round 1 drafts the 2nd and 3rd tokens
      reqs[i].window = 4;
      reqs[i].passes = 2;
      reqs[i].sampling = {kTemperature, 0, 1.0f, uint64_t(batch * 1000 + i),
                          true};
    }
    auto results = engine.Generate(reqs);
    ASSERT_TRUE(results.ok());
    for (const GenerationResult& r : *results) {
      ASSERT_EQ(r.tokens.size(), 4u);
      ++counts[r.tokens[1] * 6 + r.tokens[2]];
      accepted += Summarize(r.rounds).accepted_tokens;
    }
  }
  // Random drafts over 6 tokens get accepted often enough to matter.
  EXPECT_GT(accepted, kSamples / 10);
  // Merge cells expected below 5 counts into one.
  double chi2 = 0, small_e = 0, small_o = 0;
  int cells = 0;
  for (int i = 0; i < 36; ++i) {
    const double e = exact[i] * kSamples;
    if (e < 5) {
      small_e += e;
      small_o += counts[i];
      continue;
    }
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  if (small_e > 0) {
    chi2 += (small_o - small_e) * (small_o - small_e) / std::max(small_e, 1.0);
    ++cells;
  }
  const double dof = cells - 1;
  // Wilson-Hilferty approximation of the chi-square quantile at p = 0.001.
  const double z = 3.09;
  const double crit =
      dof * std::pow(1 - 2 / (9 * dof) + z * std::sqrt(2 / (9 * dof)), 3);
  EXPECT_LT(chi2, crit) << "dof " << dof;
}

}  // namespace
}  // namespace dedit
