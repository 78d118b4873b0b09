// TargetBatcher's steps (admission, planning, the forward, the commit, the
// warm-up) and TargetWorker's queue, warm-up and poisoning by a sticky
// device error (injected through before_forward_for_test), on a tiny random
// target. The in-process LocalVerifier over the same weights is the
// reference for every token and feature row.
#include "target_service/target_worker.h"

#include <ATen/Functions.h>

#include <chrono>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "common/model/local_backends.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"

namespace dedit {
namespace {

using testing::GreedyReference;
using testing::MakeTinyPair;
using testing::RandomPrompt;
using testing::TestDevice;

// Records what a ContextPublisher (or an in-process ContextSink) is told.
class RecordingPublisher : public ContextPublisher {
 public:
  struct Event {
    SequenceId sequence = 0;
    int64_t start = 0;
    at::Tensor features;  // CPU f32 copy; undefined for a release
    bool release = false;
  };

  absl::Status OnContext(SequenceId sequence, int64_t start,
                         const at::Tensor& features) override {
    at::Tensor copy = features.to(at::kCPU, at::kFloat).clone();
    absl::MutexLock lock(&mu_);
    events_.push_back({sequence, start, std::move(copy), false});
    return absl::OkStatus();
  }
  void OnRelease(SequenceId sequence) override {
    absl::MutexLock lock(&mu_);
    events_.push_back({sequence, 0, at::Tensor(), true});
  }

  std::vector<Event> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  // The context events of `sequence`, in order.
  std::vector<Event> ContextOf(SequenceId sequence) const {
    std::vector<Event> out;
    for (const Event& e : events()) {
      if (e.sequence == sequence && !e.release) out.push_back(e);
    }
    return out;
  }
  bool Released(SequenceId sequence) const {
    for (const Event& e : events()) {
      if (e.sequence == sequence && e.release) return true;
    }
    return false;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
};

// All of a sequence's published features, concatenated.
at::Tensor Concat(const std::vector<RecordingPublisher::Event>& events) {
  std::vector<at::Tensor> parts;
  for (const auto& e : events) parts.push_back(e.features);
  return at::cat(parts, 0);
}

TargetPrefillItem Item(SequenceId sequence, std::vector<int32_t> prompt,
                       int64_t reserve_tokens = 0) {
  TargetPrefillItem item;
  item.work.sequence = sequence;
  item.work.prompt = std::move(prompt);
  item.reserve_tokens = reserve_tokens;
  return item;
}

// Callbacks of the batcher run inside the step that answers them, so plain
// captures suffice there.
struct PrefillAnswer {
  bool called = false;
  std::vector<absl::StatusOr<int32_t>> results;
};
TargetPrefillJob PrefillJob(std::vector<TargetPrefillItem> items,
                            PrefillAnswer* answer) {
  return {std::move(items),
          [answer](std::vector<absl::StatusOr<int32_t>> r) {
            answer->called = true;
            answer->results = std::move(r);
          },
          false};
}

struct VerifyAnswer {
  bool called = false;
  absl::StatusOr<std::vector<VerifyOutcome>> result;
};
TargetVerifyJob VerifyJob(std::vector<VerifyWork> items, VerifyAnswer* answer) {
  return {std::move(items),
          [answer](absl::StatusOr<std::vector<VerifyOutcome>> r) {
            answer->called = true;
            answer->result = std::move(r);
          },
          false};
}

class TargetBatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = DefaultTinySpec();
    pair_ = MakeTinyPair(spec_, 7);
  }

  // A second copy of the pair's target: the batcher owns its model, the
  // pair's copy serves as the in-process reference.
  std::unique_ptr<Qwen3Model> LoadTarget() {
    Qwen3Model::Options opts;
    opts.device = TestDevice();
    opts.feature_layer_ids = spec_.drafter.target_layer_ids;
    auto model = Qwen3Model::Load(pair_->dir + "/target", opts);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }

  // Publishes to `publisher`, else to publisher_.
  std::unique_ptr<TargetBatcher> MakeBatcher(
      TargetWorkerOptions options, RecordingPublisher* publisher = nullptr) {
    return std::make_unique<TargetBatcher>(
        LoadTarget(), publisher != nullptr ? publisher : &publisher_,
        [this](const TargetForwardStats& s) { forwards_.push_back(s); },
        options);
  }

  // Steps 4 and 5 (the forward must run before the plan moves).
  static void RunAndCommit(TargetBatcher& batcher, TargetForwardPlan plan) {
    const absl::StatusOr<TargetForwardResult> forward = batcher.RunPlan(plan);
    batcher.CommitPlan(std::move(plan), forward);
  }

  // The in-process verifier's first token for `prompt` (one unchunked
  // forward); its features go to `sink`.
  int32_t InProcessFirstToken(const std::vector<int32_t>& prompt,
                              RecordingPublisher* sink) {
    LocalVerifier verifier(pair_->target.get(), sink);
    auto step = verifier.Step({{77, prompt, SamplingParams()}}, {});
    EXPECT_TRUE(step.ok()) << step.status();
    EXPECT_TRUE(verifier.Release(77).ok());
    return step.ok() ? step->first_tokens[0] : -1;
  }

  TinyModelSpec spec_;
  std::unique_ptr<testing::TinyPair> pair_;
  RecordingPublisher publisher_;
  std::vector<TargetForwardStats> forwards_;
};

TEST_F(TargetBatcherTest, AdmissionRefusesOnlyThePromptOverKvCapacity) {
  TargetWorkerOptions options;
  options.kv_capacity_tokens = 100;
  auto batcher = MakeBatcher(options);
  const std::vector<int32_t> a = RandomPrompt(8, 128, 1);
  const std::vector<int32_t> c = RandomPrompt(5, 128, 3);
  PrefillAnswer answer;
  std::vector<TargetPrefillJob> jobs;
  jobs.push_back(PrefillJob(
      {Item(1, a, 40), Item(2, RandomPrompt(8, 128, 2), 70), Item(3, c, 50)},
      &answer));
  batcher->AdmitPrefills(std::move(jobs));
  EXPECT_FALSE(answer.called);  // two prompts are still to be prefilled
  EXPECT_EQ(batcher->snapshot().reserved_tokens, 90);
  EXPECT_EQ(batcher->snapshot().num_sequences, 2);

  batcher->Step({}, {}, {});
  ASSERT_TRUE(answer.called);
  ASSERT_EQ(answer.results.size(), 3u);
  ASSERT_TRUE(answer.results[0].ok()) << answer.results[0].status();
  EXPECT_EQ(answer.results[1].status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(answer.results[2].ok()) << answer.results[2].status();
  EXPECT_EQ(*answer.results[0], GreedyReference(*pair_->target, a, 1)[0]);
  EXPECT_EQ(*answer.results[2], GreedyReference(*pair_->target, c, 1)[0]);
  // The refused prompt never reached the model or the drafter.
  EXPECT_TRUE(publisher_.ContextOf(2).empty());
  EXPECT_EQ(batcher->snapshot().num_sequences, 2);
  EXPECT_EQ(batcher->snapshot().cached_tokens, 13);
}

TEST_F(TargetBatcherTest, AdmissionRejectsBadPromptsAlone) {
  auto batcher = MakeBatcher(TargetWorkerOptions());
  TargetPrefillItem bad_sampling = Item(6, {1, 2});
  bad_sampling.work.sampling.temperature = -1.0f;
  PrefillAnswer answer;
  std::vector<TargetPrefillJob> jobs;
  jobs.push_back(PrefillJob(
      {Item(1, {}), Item(2, {5, 128}), Item(3, {-1}),
       Item(4, std::vector<int32_t>(spec_.target.max_position_embeddings, 1)),
       Item(5, {4, 5, 6}), Item(5, {7}), std::move(bad_sampling)},
      &answer));
  batcher->Step({}, std::move(jobs), {});
  ASSERT_TRUE(answer.called);
  ASSERT_EQ(answer.results.size(), 7u);
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(answer.results[0].status().code(), kInvalid);  // empty
  EXPECT_EQ(answer.results[1].status().code(), kInvalid);  // id == vocab
  EXPECT_EQ(answer.results[2].status().code(), kInvalid);  // negative id
  EXPECT_EQ(answer.results[3].status().code(), kInvalid);  // whole context
  EXPECT_TRUE(answer.results[4].ok()) << answer.results[4].status();
  EXPECT_EQ(answer.results[5].status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(answer.results[6].status().code(), kInvalid);  // temperature
  EXPECT_EQ(batcher->snapshot().num_sequences, 1);
  EXPECT_EQ(batcher->snapshot().reserved_tokens, 4);  // prompt + 1
}

// A reservation no sequence can use (or a negative
// one) is refused by name, and the reserved total never overflows or goes
// negative.
TEST_F(TargetBatcherTest, AdmissionRefusesReservationsBeyondTheContext) {
  TargetWorkerOptions options;
  options.kv_capacity_tokens = 1000;
  auto batcher = MakeBatcher(options);
  const int64_t context = spec_.target.max_position_embeddings;
  PrefillAnswer answer;
  std::vector<TargetPrefillJob> jobs;
  jobs.push_back(
      PrefillJob({Item(1, {1, 2, 3}, std::numeric_limits<int64_t>::max()),
                  Item(2, {1, 2, 3}, -5), Item(3, {1, 2, 3}, context + 1),
                  Item(4, {1, 2, 3}, std::numeric_limits<int64_t>::min()),
                  Item(5, {1, 2, 3}, 40)},
                 &answer));
  batcher->Step({}, std::move(jobs), {});
  ASSERT_TRUE(answer.called);
  ASSERT_EQ(answer.results.size(), 5u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(answer.results[i].status().code(),
              absl::StatusCode::kInvalidArgument)
        << i;
    EXPECT_TRUE(absl::StrContains(answer.results[i].status().message(),
                                  "reserve_tokens"))
        << answer.results[i].status();
  }
  ASSERT_TRUE(answer.results[4].ok()) << answer.results[4].status();
  EXPECT_EQ(batcher->snapshot().reserved_tokens, 40);
  EXPECT_EQ(batcher->snapshot().num_sequences, 1);

  // A whole-context reservation beyond the capacity left is refused as
  // full, and the total stays put.
  TargetWorkerOptions small;
  small.kv_capacity_tokens = context + 10;
  auto full = MakeBatcher(small);
  PrefillAnswer second;
  jobs.clear();
  jobs.push_back(PrefillJob(
      {Item(6, {1, 2}, context), Item(7, {1, 2}, context)}, &second));
  full->Step({}, std::move(jobs), {});
  ASSERT_TRUE(second.called);
  ASSERT_TRUE(second.results[0].ok()) << second.results[0].status();
  EXPECT_EQ(second.results[1].status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full->snapshot().reserved_tokens, context);
}

TEST_F(TargetBatcherTest, PlanForwardPacksVerifyBlocksFirstThenChunks) {
  TargetWorkerOptions options;
  options.max_batch_tokens = 16;
  auto batcher = MakeBatcher(options);
  PrefillAnswer first;
  std::vector<TargetPrefillJob> jobs;
  jobs.push_back(PrefillJob({Item(1, RandomPrompt(6, 128, 1))}, &first));
  batcher->Step({}, std::move(jobs), {});
  ASSERT_TRUE(first.called && first.results[0].ok());

  PrefillAnswer second;
  jobs.clear();
  jobs.push_back(PrefillJob({Item(2, RandomPrompt(30, 128, 2))}, &second));
  batcher->AdmitPrefills(std::move(jobs));
  VerifyAnswer verified;
  std::vector<TargetVerifyJob> verifies;
  verifies.push_back(
      VerifyJob({{1, 6, {*first.results[0], 3, 4, 5}}}, &verified));
  TargetForwardPlan plan = batcher->PlanForward(std::move(verifies));
  EXPECT_TRUE(plan.refused.empty());
  ASSERT_EQ(plan.verifies.size(), 1u);
  ASSERT_EQ(plan.segments.size(), 2u);
  EXPECT_EQ(plan.segments[0].sequence, 1u);
  EXPECT_EQ(plan.segments[0].start, 6);
  EXPECT_EQ(plan.segments[0].logit_rows, (std::vector<int>{0, 1, 2, 3}));
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].sequence, 2u);
  EXPECT_EQ(plan.chunks[0].start, 0);
  EXPECT_EQ(plan.chunks[0].length, 12);  // what the block left of 16
  EXPECT_FALSE(plan.chunks[0].last);
  EXPECT_TRUE(plan.segments[1].logit_rows.empty());
  EXPECT_EQ(plan.tokens, 16);
  RunAndCommit(*batcher, std::move(plan));
  ASSERT_TRUE(verified.called);
  EXPECT_TRUE(verified.result.ok()) << verified.result.status();
  EXPECT_FALSE(second.called);

  // Without verify blocks the whole budget goes to the prompt.
  plan = batcher->PlanForward({});
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 12);
  EXPECT_EQ(plan.chunks[0].length, 16);
  EXPECT_FALSE(plan.chunks[0].last);
  RunAndCommit(*batcher, std::move(plan));
  plan = batcher->PlanForward({});
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].start, 28);
  EXPECT_EQ(plan.chunks[0].length, 2);
  EXPECT_TRUE(plan.chunks[0].last);
  EXPECT_EQ(plan.segments[0].logit_rows, (std::vector<int>{1}));
  RunAndCommit(*batcher, std::move(plan));
  ASSERT_TRUE(second.called);
  EXPECT_TRUE(second.results[0].ok()) << second.results[0].status();
  EXPECT_FALSE(batcher->has_prefills());
}

TEST_F(TargetBatcherTest, PlanForwardRefusesBadVerifyCalls) {
  TargetWorkerOptions options;
  options.max_batch_tokens = 8;
  auto batcher = MakeBatcher(options);
  PrefillAnswer ready;
  std::vector<TargetPrefillJob> jobs;
  jobs.push_back(PrefillJob({Item(1, {1, 2, 3}), Item(2, {4, 5})}, &ready));
  batcher->Step({}, std::move(jobs), {});
  ASSERT_TRUE(ready.called);
  PrefillAnswer long_prompt;
  jobs.clear();
  jobs.push_back(PrefillJob({Item(3, RandomPrompt(20, 128, 3))}, &long_prompt));
  batcher->AdmitPrefills(std::move(jobs));

  std::vector<std::pair<std::vector<VerifyWork>, absl::StatusCode>> cases = {
      {{{9, 0, {1}}}, absl::StatusCode::kNotFound},
      {{{1, 2, {1}}}, absl::StatusCode::kFailedPrecondition},  // start != 3
      {{{3, 0, {1}}}, absl::StatusCode::kFailedPrecondition},  // prefilling
      {{{1, 3, {}}}, absl::StatusCode::kInvalidArgument},
      {{{1, 3, {1, 200}}}, absl::StatusCode::kInvalidArgument},
      {{{1, 3, {1}}, {1, 3, {2}}}, absl::StatusCode::kInvalidArgument},
      {{{2, 2, {1}}}, absl::StatusCode::kOk},
      // Sequence 2 is already in this forward through the call above.
      {{{1, 3, {1}}, {2, 2, {1}}}, absl::StatusCode::kInvalidArgument},
  };
  std::vector<VerifyAnswer> answers(cases.size());
  std::vector<TargetVerifyJob> verifies;
  for (size_t i = 0; i < cases.size(); ++i) {
    verifies.push_back(VerifyJob(cases[i].first, &answers[i]));
  }
  TargetForwardPlan plan = batcher->PlanForward(std::move(verifies));
  EXPECT_EQ(plan.refused.size(), cases.size() - 1);
  EXPECT_EQ(plan.verifies.size(), 1u);
  for (const VerifyAnswer& a : answers) EXPECT_FALSE(a.called);
  RunAndCommit(*batcher, std::move(plan));
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(answers[i].called) << i;
    EXPECT_EQ(answers[i].result.status().code(), cases[i].second) << i;
  }
}

TEST_F(TargetBatcherTest, RunPlanReportsTheForward) {
  TargetWorkerOptions options;
  options.kv_capacity_tokens = 1000;
  auto batcher = MakeBatcher(options);
  auto empty = batcher->RunPlan(batcher->PlanForward({}));
  EXPECT_TRUE(empty.ok());
  EXPECT_TRUE(forwards_.empty());  // nothing ran

  PrefillAnswer answer;
  std::vector<TargetPrefillJob> jobs;
  jobs.push_back(PrefillJob({Item(1, {1, 2, 3}), Item(2, {4, 5})}, &answer));
  batcher->AdmitPrefills(std::move(jobs));
  TargetForwardPlan plan = batcher->PlanForward({});
  auto forward = batcher->RunPlan(plan);
  ASSERT_TRUE(forward.ok()) << forward.status();
  EXPECT_EQ(forward->logit_offsets.size(), 2u);
  ASSERT_EQ(forwards_.size(), 1u);
  EXPECT_EQ(forwards_[0].segments, 2);
  EXPECT_EQ(forwards_[0].tokens, 5);
  EXPECT_EQ(forwards_[0].cached_tokens, 5);
  EXPECT_EQ(forwards_[0].kv_capacity_tokens, 1000);
  EXPECT_GE(forwards_[0].seconds, 0.0);
  EXPECT_FALSE(answer.called);  // only CommitPlan answers
  batcher->CommitPlan(std::move(plan), forward);
  EXPECT_TRUE(answer.called);
}

// Losslessness of the service path: the same prefill and verify work gives
// the in-process verifier's tokens, acceptances and feature rows, greedy and
// seeded-sampled.
TEST_F(TargetBatcherTest, CommitPlanMatchesTheInProcessVerifier) {
  for (float temperature : {0.0f, 0.8f}) {
    SCOPED_TRACE(temperature);
    RecordingPublisher reference_sink;
    RecordingPublisher publisher;
    LocalVerifier reference(pair_->target.get(), &reference_sink);
    auto batcher = MakeBatcher(TargetWorkerOptions(), &publisher);
    SamplingParams sampling;
    sampling.temperature = temperature;
    sampling.top_k = temperature > 0 ? 20 : 0;
    sampling.has_seed = true;
    sampling.seed = 11;
    const std::vector<int32_t> prompt = RandomPrompt(12, 128, 5);
    const std::vector<int32_t> greedy =
        GreedyReference(*pair_->target, prompt, 40);

    auto ref_step = reference.Step({{1, prompt, sampling}}, {});
    ASSERT_TRUE(ref_step.ok()) << ref_step.status();
    PrefillAnswer answer;
    TargetPrefillItem item = Item(1, prompt);
    item.work.sampling = sampling;
    std::vector<TargetPrefillJob> jobs;
    jobs.push_back(PrefillJob({item}, &answer));
    batcher->Step({}, std::move(jobs), {});
    ASSERT_TRUE(answer.called && answer.results[0].ok());
    int32_t bonus = *answer.results[0];
    ASSERT_EQ(bonus, ref_step->first_tokens[0]);

    int64_t start = static_cast<int64_t>(prompt.size());
    int total_accepted = 0;
    for (int round = 0; round < 6; ++round) {
      // Drafts from the greedy continuation, one slot corrupted: at T = 0
      // this accepts a prefix of varying length.
      std::vector<int32_t> block = {bonus};
      const int64_t out = start - static_cast<int64_t>(prompt.size());
      for (int j = 1; j < 5; ++j) {
        int32_t t = greedy[std::min<int64_t>(out + j, 39)];
        if (j == 1 + round % 4) t = (t + 1) % 128;
        block.push_back(t);
      }
      const VerifyWork work{1, start, block};
      auto ref = reference.Step({}, {work});
      ASSERT_TRUE(ref.ok()) << ref.status();
      VerifyAnswer verified;
      std::vector<TargetVerifyJob> verifies;
      verifies.push_back(VerifyJob({work}, &verified));
      batcher->Step({}, {}, std::move(verifies));
      ASSERT_TRUE(verified.called);
      ASSERT_TRUE(verified.result.ok()) << verified.result.status();
      const VerifyOutcome& got = (*verified.result)[0];
      const VerifyOutcome& want = ref->verified[0];
      EXPECT_EQ(got.accepted, want.accepted) << "round " << round;
      EXPECT_EQ(got.target_tokens, want.target_tokens) << "round " << round;
      total_accepted += got.accepted;
      start += got.accepted + 1;
      bonus = got.target_tokens[got.accepted];
      EXPECT_EQ(batcher->snapshot().cached_tokens, start);
    }
    if (temperature == 0.0f) EXPECT_GT(total_accepted, 0);
    const auto got = publisher.ContextOf(1);
    const auto want = reference_sink.ContextOf(1);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].start, want[i].start);
      EXPECT_TRUE(at::allclose(got[i].features, want[i].features, 1e-4, 1e-5))
          << "chunk " << i;
    }
    ASSERT_TRUE(reference.Release(1).ok());
  }
}

TEST_F(TargetBatcherTest, ChunkedPrefillMatchesTheUnchunkedForward) {
  TargetWorkerOptions options;
  options.max_batch_tokens = 16;
  auto batcher = MakeBatcher(options);
  const std::vector<int32_t> prompt = RandomPrompt(40, 128, 9);
  RecordingPublisher unchunked;
  const int32_t want = InProcessFirstToken(prompt, &unchunked);

  PrefillAnswer answer;
  std::vector<TargetPrefillJob> jobs;
  jobs.push_back(PrefillJob({Item(1, prompt)}, &answer));
  batcher->Step({}, std::move(jobs), {});
  EXPECT_FALSE(answer.called);
  batcher->Step({}, {}, {});
  EXPECT_FALSE(answer.called);
  batcher->Step({}, {}, {});
  ASSERT_TRUE(answer.called);
  ASSERT_TRUE(answer.results[0].ok()) << answer.results[0].status();
  EXPECT_EQ(*answer.results[0], want);

  ASSERT_EQ(forwards_.size(), 3u);
  EXPECT_EQ(forwards_[0].tokens, 16);
  EXPECT_EQ(forwards_[1].tokens, 16);
  EXPECT_EQ(forwards_[2].tokens, 8);
  const auto chunks = publisher_.ContextOf(1);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].start, 0);
  EXPECT_EQ(chunks[1].start, 16);
  EXPECT_EQ(chunks[2].start, 32);
  EXPECT_EQ(chunks[2].features.size(0), 8);
  const at::Tensor whole = Concat(unchunked.ContextOf(77));
  EXPECT_TRUE(at::allclose(Concat(chunks), whole, 1e-4, 1e-5));
}

TEST_F(TargetBatcherTest, ReleaseMidPrefillCancelsAndReturnsCapacity) {
  TargetWorkerOptions options;
  options.max_batch_tokens = 16;
  options.kv_capacity_tokens = 100;
  auto batcher = MakeBatcher(options);
  PrefillAnswer answer;
  std::vector<TargetPrefillJob> jobs;
  jobs.push_back(PrefillJob({Item(1, RandomPrompt(40, 128, 1), 60)}, &answer));
  batcher->Step({}, std::move(jobs), {});  // the first chunk only
  ASSERT_FALSE(answer.called);
  ASSERT_EQ(publisher_.ContextOf(1).size(), 1u);

  PrefillAnswer refused;
  jobs.clear();
  jobs.push_back(PrefillJob({Item(2, {1, 2}, 60)}, &refused));
  batcher->AdmitPrefills(std::move(jobs));
  ASSERT_TRUE(refused.called);
  EXPECT_EQ(refused.results[0].status().code(),
            absl::StatusCode::kResourceExhausted);

  int released = -1;
  std::vector<TargetReleaseJob> releases;
  releases.push_back({{1, 42}, [&released](int n) { released = n; }});
  batcher->ApplyReleases(std::move(releases));
  EXPECT_EQ(released, 1);  // 42 never existed
  ASSERT_TRUE(answer.called);
  EXPECT_EQ(answer.results[0].status().code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(batcher->has_prefills());
  const TargetWorkerSnapshot s = batcher->snapshot();
  EXPECT_EQ(s.num_sequences, 0);
  EXPECT_EQ(s.reserved_tokens, 0);
  EXPECT_EQ(s.cached_tokens, 0);
  // The drafter is told after the sequence's last context.
  const auto events = publisher_.events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_FALSE(events[0].release);
  EXPECT_TRUE(events[1].release);
  EXPECT_EQ(events[1].sequence, 1u);

  batcher->Step({}, {}, {});
  EXPECT_EQ(forwards_.size(), 1u);  // nothing left to run
  PrefillAnswer admitted;
  jobs.clear();
  jobs.push_back(PrefillJob({Item(2, {1, 2}, 60)}, &admitted));
  batcher->Step({}, std::move(jobs), {});
  ASSERT_TRUE(admitted.called);
  EXPECT_TRUE(admitted.results[0].ok()) << admitted.results[0].status();
}

TEST_F(TargetBatcherTest, FailedForwardFailsItsCallsAndDropsItsPrompts) {
  TargetWorkerOptions options;
  options.max_batch_tokens = 8;
  auto batcher = MakeBatcher(options);
  PrefillAnswer ready;
  std::vector<TargetPrefillJob> jobs;
  jobs.push_back(PrefillJob({Item(1, {1, 2, 3})}, &ready));
  batcher->Step({}, std::move(jobs), {});
  ASSERT_TRUE(ready.called);

  PrefillAnswer prefill;
  jobs.clear();
  jobs.push_back(PrefillJob({Item(2, RandomPrompt(20, 128, 2))}, &prefill));
  batcher->AdmitPrefills(std::move(jobs));
  VerifyAnswer verified;
  std::vector<TargetVerifyJob> verifies;
  verifies.push_back(VerifyJob({{1, 3, {*ready.results[0], 7}}}, &verified));
  TargetForwardPlan plan = batcher->PlanForward(std::move(verifies));
  ASSERT_EQ(plan.chunks.size(), 1u);
  batcher->CommitPlan(std::move(plan), absl::InternalError("device lost"));
  ASSERT_TRUE(verified.called);
  EXPECT_EQ(verified.result.status().code(), absl::StatusCode::kInternal);
  ASSERT_TRUE(prefill.called);
  EXPECT_EQ(prefill.results[0].status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(publisher_.Released(2));
  EXPECT_FALSE(publisher_.Released(1));  // the router releases it
  EXPECT_EQ(batcher->snapshot().num_sequences, 1);
  EXPECT_FALSE(batcher->has_prefills());
}

TEST_F(TargetBatcherTest, CancelPrefillsAnswersAndDropsEveryPrompt) {
  TargetWorkerOptions options;
  options.max_batch_tokens = 8;
  auto batcher = MakeBatcher(options);
  PrefillAnswer answer;
  std::vector<TargetPrefillJob> jobs;
  jobs.push_back(PrefillJob(
      {Item(1, RandomPrompt(20, 128, 1)), Item(2, RandomPrompt(20, 128, 2))},
      &answer));
  batcher->Step({}, std::move(jobs), {});  // 8 tokens of the first prompt
  ASSERT_FALSE(answer.called);
  batcher->CancelPrefills(absl::UnavailableError("shutting down"));
  ASSERT_TRUE(answer.called);
  EXPECT_EQ(answer.results[0].status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(answer.results[1].status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(publisher_.Released(1));
  EXPECT_TRUE(publisher_.Released(2));
  EXPECT_FALSE(batcher->has_prefills());
  EXPECT_EQ(batcher->snapshot().num_sequences, 0);
  EXPECT_EQ(batcher->snapshot().reserved_tokens, 0);
}

// A sequence no call names for its lease is released
// (KV, reservation, the drafter told); verify calls and keep-alives renew
// the lease, and a prompt being prefilled never expires.
TEST_F(TargetBatcherTest, IdleSequencesExpireUnlessACallRenewsTheirLease) {
  TargetWorkerOptions options;
  options.sequence_lease = absl::Seconds(10);
  options.kv_capacity_tokens = 1000;
  auto batcher = MakeBatcher(options);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  PrefillAnswer prefilled;
  std::vector<TargetPrefillJob> jobs;
  jobs.push_back(PrefillJob({Item(1, RandomPrompt(6, 128, 1), 20),
                             Item(2, RandomPrompt(6, 128, 2), 20),
                             Item(3, RandomPrompt(6, 128, 3), 20)},
                            &prefilled));
  batcher->Step({}, std::move(jobs), {}, {}, t0);
  ASSERT_TRUE(prefilled.called);
  for (const auto& r : prefilled.results) ASSERT_TRUE(r.ok()) << r.status();

  // t0 + 6 s: a round verifies sequence 2; a keep-alive names 3 and an id
  // that does not exist.
  VerifyAnswer verified;
  std::vector<TargetVerifyJob> verifies;
  verifies.push_back(VerifyJob({{2, 6, {*prefilled.results[1]}}}, &verified));
  std::vector<SequenceId> missing = {7};
  std::vector<TargetKeepAliveJob> keep_alives;
  keep_alives.push_back(
      {{3, 99}, [&](std::vector<SequenceId> m) { missing = std::move(m); }});
  batcher->Step({}, {}, std::move(verifies), std::move(keep_alives),
                t0 + absl::Seconds(6));
  ASSERT_TRUE(verified.called);
  ASSERT_TRUE(verified.result.ok()) << verified.result.status();
  EXPECT_EQ(missing, std::vector<SequenceId>{99});
  EXPECT_EQ(batcher->snapshot().num_sequences, 3);

  // t0 + 10 s: only sequence 1 was idle for the whole lease.
  batcher->Step({}, {}, {}, {}, t0 + absl::Seconds(10));
  EXPECT_EQ(batcher->snapshot().num_sequences, 2);
  EXPECT_EQ(batcher->snapshot().reserved_tokens, 40);
  EXPECT_EQ(batcher->snapshot().expired_sequences, 1);
  EXPECT_TRUE(publisher_.events().back().release);
  EXPECT_EQ(publisher_.events().back().sequence, 1u);

  // Just before 2 and 3 run out, then after.
  batcher->Step({}, {}, {}, {}, t0 + absl::Seconds(15.9));
  EXPECT_EQ(batcher->snapshot().num_sequences, 2);
  batcher->Step({}, {}, {}, {}, t0 + absl::Seconds(16));
  EXPECT_EQ(batcher->snapshot().num_sequences, 0);
  EXPECT_EQ(batcher->snapshot().reserved_tokens, 0);
  EXPECT_EQ(batcher->snapshot().cached_tokens, 0);
  EXPECT_EQ(batcher->snapshot().expired_sequences, 3);

  // A verify naming an expired sequence is NOT_FOUND, as after a release.
  VerifyAnswer late;
  verifies.clear();
  verifies.push_back(VerifyJob({{3, 6, {1}}}, &late));
  batcher->Step({}, {}, std::move(verifies), {}, t0 + absl::Seconds(17));
  ASSERT_TRUE(late.called);
  EXPECT_EQ(late.result.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TargetBatcherTest, APromptBeingPrefilledNeverExpires) {
  TargetWorkerOptions options;
  options.sequence_lease = absl::Seconds(10);
  options.max_batch_tokens = 4;  // a 12-token prompt takes 3 forwards
  auto batcher = MakeBatcher(options);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const std::vector<int32_t> prompt = RandomPrompt(12, 128, 4);
  PrefillAnswer prefilled;
  std::vector<TargetPrefillJob> jobs;
  jobs.push_back(PrefillJob({Item(1, prompt)}, &prefilled));
  batcher->Step({}, std::move(jobs), {}, {}, t0);
  batcher->Step({}, {}, {}, {}, t0 + absl::Seconds(20));
  EXPECT_FALSE(prefilled.called);
  batcher->Step({}, {}, {}, {}, t0 + absl::Seconds(40));
  ASSERT_TRUE(prefilled.called);
  ASSERT_TRUE(prefilled.results[0].ok()) << prefilled.results[0].status();
  EXPECT_EQ(*prefilled.results[0],
            GreedyReference(*pair_->target, prompt, 1)[0]);
  // The lease starts when the prompt is in.
  batcher->Step({}, {}, {}, {}, t0 + absl::Seconds(49));
  EXPECT_EQ(batcher->snapshot().num_sequences, 1);
  batcher->Step({}, {}, {}, {}, t0 + absl::Seconds(50));
  EXPECT_EQ(batcher->snapshot().num_sequences, 0);
  EXPECT_EQ(batcher->snapshot().expired_sequences, 1);
}

TEST_F(TargetBatcherTest, WarmUpRunsOneForwardAndLeavesNothingBehind) {
  testing::ForwardSeam seam;
  TargetWorkerOptions options;
  options.before_forward_for_test = seam.hook();
  auto batcher = MakeBatcher(options);
  ASSERT_TRUE(batcher->WarmUp().ok());
  EXPECT_EQ(seam.forwards(), 1);
  EXPECT_TRUE(forwards_.empty());            // not in the serving metrics
  EXPECT_TRUE(publisher_.events().empty());  // nothing for the drafter
  const TargetWorkerSnapshot s = batcher->snapshot();
  EXPECT_EQ(s.num_sequences, 0);
  EXPECT_EQ(s.cached_tokens, 0);
  EXPECT_EQ(s.reserved_tokens, 0);
  EXPECT_EQ(batcher->model().num_sequences(), 0u);

  // A failed warm-up forward is reported, and drops its sequence too.
  seam.FailNext({absl::InternalError(testing::kCudaIllegalAccess)});
  const absl::Status failed = batcher->WarmUp();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(batcher->model().num_sequences(), 0u);
}

// --- TargetWorker: the same steps behind the queue and the model thread.

using testing::Pending;
using PendingPrefill = Pending<std::vector<absl::StatusOr<int32_t>>>;
using PendingVerify = Pending<absl::StatusOr<std::vector<VerifyOutcome>>>;

class TargetWorkerTest : public TargetBatcherTest {
 protected:
  std::unique_ptr<TargetWorker> MakeWorker(TargetWorkerOptions options) {
    auto worker = std::make_unique<TargetWorker>(
        LoadTarget(), &publisher_,
        [this](const TargetForwardStats& s) {
          absl::MutexLock lock(&stats_mu_);
          worker_forwards_.push_back(s);
        },
        options);
    worker->SetPoisonListener([this](const absl::Status& poisoned) {
      absl::MutexLock lock(&stats_mu_);
      poison_events_.push_back(poisoned);
    });
    return worker;
  }
  // Returns once the worker has finished the step that was running, so its
  // snapshot is current: releases are answered in the next step, after the
  // previous one published its snapshot.
  static void Sync(TargetWorker& worker) {
    Pending<int> done;
    worker.Release({}, done.callback());
    done.Get();
  }

  std::vector<TargetForwardStats> worker_forwards() {
    absl::MutexLock lock(&stats_mu_);
    return worker_forwards_;
  }

  // A started worker that would hold a forward for a missing companion far
  // longer than any test, with sequence 1 prefilled ([1, 2, 3]) in one
  // forward; `first` gets its first token.
  void StartWithOneSequence(std::unique_ptr<TargetWorker>* worker,
                            int32_t* first) {
    TargetWorkerOptions options;
    options.max_batch_wait_us = 20'000'000;
    *worker = MakeWorker(options);
    (*worker)->Start();
    PendingPrefill ready;
    (*worker)->Prefill({Item(1, {1, 2, 3})}, ready.callback());
    auto tokens = ready.Get();
    ASSERT_TRUE(tokens.has_value() && (*tokens)[0].ok());
    *first = *(*tokens)[0];
    ASSERT_EQ(worker_forwards().size(), 1u);
  }

  // The second forward packed sequence 1's verify block and the 2-token
  // prompt of sequence 2.
  void ExpectVerifyAndPrefillShareTheSecondForward() {
    const auto forwards = worker_forwards();
    ASSERT_EQ(forwards.size(), 2u);
    EXPECT_EQ(forwards[1].segments, 2);
    EXPECT_EQ(forwards[1].tokens, 3);
  }

  std::vector<absl::Status> poison_events() {
    absl::MutexLock lock(&stats_mu_);
    return poison_events_;
  }

  absl::Mutex stats_mu_;
  std::vector<TargetForwardStats> worker_forwards_ ABSL_GUARDED_BY(stats_mu_);
  std::vector<absl::Status> poison_events_ ABSL_GUARDED_BY(stats_mu_);
};

// Also with an idle spin longer than the test (common/base/spin_wait.h): then
// every call is picked up by polling instead of a wake-up, and stopping
// still ends the poll (the worker is destroyed at the end).
class TargetWorkerSpinTest : public TargetWorkerTest,
                             public ::testing::WithParamInterface<int64_t> {};
INSTANTIATE_TEST_SUITE_P(IdleSpin, TargetWorkerSpinTest,
                         ::testing::Values(0, 60'000'000));

TEST_P(TargetWorkerSpinTest, DecodesLikeGreedyTargetOnly) {
  TargetWorkerOptions options;
  options.idle_spin_us = GetParam();
  auto worker = MakeWorker(options);
  worker->Start();
  const std::vector<int32_t> prompt = RandomPrompt(10, 128, 4);
  const std::vector<int32_t> greedy =
      GreedyReference(*pair_->target, prompt, 8);
  PendingPrefill prefill;
  worker->Prefill({Item(1, prompt)}, prefill.callback());
  auto first = prefill.Get();
  ASSERT_TRUE(first.has_value() && (*first)[0].ok());
  std::vector<int32_t> out = {*(*first)[0]};
  int64_t start = static_cast<int64_t>(prompt.size());
  while (out.size() < greedy.size()) {
    PendingVerify verify;
    worker->Verify({{1, start, {out.back()}}}, verify.callback());
    auto result = verify.Get();
    ASSERT_TRUE(result.has_value() && result->ok());
    ASSERT_EQ((**result)[0].accepted, 0);
    out.push_back((**result)[0].target_tokens[0]);
    ++start;
  }
  EXPECT_EQ(out, greedy);
  Sync(*worker);
  EXPECT_EQ(worker->snapshot().cached_tokens, start);
  EXPECT_EQ(worker->snapshot().num_sequences, 1);
}

TEST_F(TargetWorkerTest, ChunkedPrefillPublishesEveryChunkInOrder) {
  TargetWorkerOptions options;
  options.max_batch_tokens = 16;
  auto worker = MakeWorker(options);
  worker->Start();
  const std::vector<int32_t> prompt = RandomPrompt(40, 128, 12);
  RecordingPublisher unchunked;
  const int32_t want = InProcessFirstToken(prompt, &unchunked);
  PendingPrefill prefill;
  worker->Prefill({Item(1, prompt)}, prefill.callback());
  auto first = prefill.Get();
  ASSERT_TRUE(first.has_value() && (*first)[0].ok());
  EXPECT_EQ(*(*first)[0], want);
  EXPECT_EQ(worker_forwards().size(), 3u);
  const auto chunks = publisher_.ContextOf(1);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].start, 0);
  EXPECT_EQ(chunks[1].start, 16);
  EXPECT_EQ(chunks[2].start, 32);
  EXPECT_TRUE(at::allclose(Concat(chunks), Concat(unchunked.ContextOf(77)),
                           1e-4, 1e-5));
}

TEST_F(TargetWorkerTest, AnnouncedPrefillAndVerifyShareOneForward) {
  std::unique_ptr<TargetWorker> worker;
  int32_t first = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithOneSequence(&worker, &first));

  PendingPrefill prefill;
  worker->Prefill({Item(2, {4, 5})}, prefill.callback(), /*with_verify=*/true);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(prefill.ready());  // held for its companion
  PendingVerify verify;
  worker->Verify({{1, 3, {first}}}, verify.callback(), /*with_prefill=*/true);
  auto verified = verify.Get();
  auto prefilled = prefill.Get();
  ASSERT_TRUE(verified.has_value() && verified->ok());
  ASSERT_TRUE(prefilled.has_value() && (*prefilled)[0].ok());
  ExpectVerifyAndPrefillShareTheSecondForward();
}

TEST_F(TargetWorkerTest, StepRunsPrefillAndVerifyInOneForwardWithoutWaiting) {
  std::unique_ptr<TargetWorker> worker;
  int32_t first = 0;  // a companion wait would hang the test
  ASSERT_NO_FATAL_FAILURE(StartWithOneSequence(&worker, &first));

  PendingPrefill prefill;
  PendingVerify verify;
  worker->Step({Item(2, {4, 5})}, prefill.callback(), {{1, 3, {first}}},
               verify.callback());
  auto verified = verify.Get();
  auto prefilled = prefill.Get();
  ASSERT_TRUE(verified.has_value() && verified->ok());
  ASSERT_TRUE(prefilled.has_value() && (*prefilled)[0].ok());
  ExpectVerifyAndPrefillShareTheSecondForward();

  // A verify-only step: the prefill callback is never called.
  PendingPrefill unused;
  PendingVerify next;
  worker->Step({}, unused.callback(),
               {{1, 4, {(*verified)->at(0).target_tokens[0]}}},
               next.callback());
  auto again = next.Get();
  ASSERT_TRUE(again.has_value() && again->ok());
  EXPECT_FALSE(unused.ready());
}

TEST_F(TargetWorkerTest, ReleaseAnswersAndTellsThePublisher) {
  TargetWorkerOptions options;
  options.kv_capacity_tokens = 50;
  auto worker = MakeWorker(options);
  worker->Start();
  PendingPrefill prefill;
  worker->Prefill({Item(1, {1, 2, 3}, 50), Item(2, {1}, 10)},
                  prefill.callback());
  auto results = prefill.Get();
  ASSERT_TRUE(results.has_value());
  EXPECT_TRUE((*results)[0].ok());
  EXPECT_EQ((*results)[1].status().code(),
            absl::StatusCode::kResourceExhausted);
  Sync(*worker);
  EXPECT_EQ(worker->snapshot().reserved_tokens, 50);

  Pending<int> released;
  worker->Release({1, 2}, released.callback());
  EXPECT_EQ(released.Get(), 1);
  EXPECT_TRUE(publisher_.Released(1));
  EXPECT_FALSE(publisher_.Released(2));
  Sync(*worker);
  const TargetWorkerSnapshot s = worker->snapshot();
  EXPECT_EQ(s.num_sequences, 0);
  EXPECT_EQ(s.reserved_tokens, 0);
  EXPECT_EQ(s.kv_capacity_tokens, 50);
}

// A sequence created with PrefillWork::context false (target-only or
// n-gram, PrefillItem.no_context on the wire) never reaches the drafter:
// no features when prefilled or verified, no release marker; its output is
// the same. The other sequence in the same forwards is published as ever.
TEST_F(TargetWorkerTest, SequencesWithoutContextAreNotPublished) {
  auto worker = MakeWorker(TargetWorkerOptions());
  worker->Start();
  const std::vector<int32_t> prompt = RandomPrompt(12, 128, 21);
  const std::vector<int32_t> greedy =
      GreedyReference(*pair_->target, prompt, 6);
  TargetPrefillItem quiet = Item(1, prompt);
  quiet.work.context = false;
  PendingPrefill prefill;
  worker->Prefill({quiet, Item(2, prompt)}, prefill.callback());
  auto first = prefill.Get();
  ASSERT_TRUE(first.has_value() && (*first)[0].ok() && (*first)[1].ok());
  std::vector<int32_t> out[2] = {{*(*first)[0]}, {*(*first)[1]}};
  int64_t start = static_cast<int64_t>(prompt.size());
  while (out[0].size() < greedy.size()) {
    PendingVerify verify;
    worker->Verify({{1, start, {out[0].back()}}, {2, start, {out[1].back()}}},
                   verify.callback());
    auto result = verify.Get();
    ASSERT_TRUE(result.has_value() && result->ok());
    for (int i = 0; i < 2; ++i)
      out[i].push_back((**result)[i].target_tokens[0]);
    ++start;
  }
  EXPECT_EQ(out[0], greedy);
  EXPECT_EQ(out[1], greedy);
  Pending<int> released;
  worker->Release({1, 2}, released.callback());
  EXPECT_EQ(released.Get(), 2);
  EXPECT_TRUE(publisher_.ContextOf(1).empty());
  EXPECT_FALSE(publisher_.Released(1));
  EXPECT_EQ(publisher_.ContextOf(2).size(), greedy.size());  // prompt + 5
  EXPECT_TRUE(publisher_.Released(2));
}

// The snapshot listener (which feeds the KV usage
// gauge) hears of a release-only step, not only of forwards.
TEST_F(TargetWorkerTest, SnapshotListenerHearsOfReleases) {
  auto worker = MakeWorker(TargetWorkerOptions());
  absl::Mutex mu;
  std::vector<TargetWorkerSnapshot> heard;
  worker->SetSnapshotListener([&](const TargetWorkerSnapshot& s) {
    absl::MutexLock lock(&mu);
    heard.push_back(s);
  });
  // Polls until the last snapshot heard has `cached` tokens (the listener
  // runs after the step's answers, so no Sync bounds it).
  auto heard_cached = [&](int64_t cached, int64_t reserved) {
    for (int i = 0; i < 400; ++i) {
      {
        absl::MutexLock lock(&mu);
        if (!heard.empty() && heard.back().cached_tokens == cached &&
            heard.back().reserved_tokens == reserved) {
          return true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  };
  worker->Start();
  PendingPrefill prefill;
  worker->Prefill({Item(1, {1, 2, 3}, 10)}, prefill.callback());
  ASSERT_TRUE(prefill.Get().has_value());
  EXPECT_TRUE(heard_cached(3, 10));
  Pending<int> released;
  worker->Release({1}, released.callback());
  EXPECT_EQ(released.Get(), 1);
  EXPECT_TRUE(heard_cached(0, 0));
  worker->Stop();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(heard.back().num_sequences, 0);
}

TEST_F(TargetWorkerTest, StoppedWorkerAnswersUnavailable) {
  auto worker = MakeWorker(TargetWorkerOptions());
  worker->Start();
  worker->Stop();
  PendingPrefill prefill;
  worker->Prefill({Item(1, {1}), Item(2, {2})}, prefill.callback());
  auto results = prefill.Get();
  ASSERT_TRUE(results.has_value());
  ASSERT_EQ(results->size(), 2u);
  EXPECT_EQ((*results)[1].status().code(), absl::StatusCode::kUnavailable);
  PendingVerify verify;
  worker->Verify({{1, 1, {1}}}, verify.callback());
  auto verified = verify.Get();
  ASSERT_TRUE(verified.has_value());
  EXPECT_EQ(verified->status().code(), absl::StatusCode::kUnavailable);
  Pending<int> released;
  worker->Release({1}, released.callback());
  EXPECT_EQ(released.Get(), 0);
}

TEST_F(TargetWorkerTest, WarmUpForwardRunsBeforeTheWorkerIsWarm) {
  testing::ForwardSeam seam;
  TargetWorkerOptions options;
  options.before_forward_for_test = seam.hook();
  auto worker = MakeWorker(options);
  EXPECT_EQ(worker->AwaitWarmUp().code(),
            absl::StatusCode::kFailedPrecondition);  // not started
  EXPECT_FALSE(worker->warmed_up());
  seam.HoldNext();
  worker->Start();
  ASSERT_TRUE(seam.AwaitHeld());  // the warm-up forward, on the thread
  EXPECT_EQ(seam.forwards(), 1);
  EXPECT_FALSE(worker->warmed_up());
  // A call that arrives meanwhile waits for the warm-up.
  PendingPrefill prefill;
  worker->Prefill({Item(1, {1, 2, 3})}, prefill.callback());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(prefill.ready());
  seam.Resume();
  EXPECT_TRUE(worker->AwaitWarmUp().ok());
  EXPECT_TRUE(worker->warmed_up());
  auto first = prefill.Get();
  ASSERT_TRUE(first.has_value() && (*first)[0].ok());
  EXPECT_EQ(seam.forwards(), 2);
  EXPECT_EQ(worker_forwards().size(), 1u);  // the warm-up is not a metric
  EXPECT_TRUE(worker->poisoned().ok());
  EXPECT_TRUE(poison_events().empty());
}

TEST_F(TargetWorkerTest, FailedWarmUpPoisonsTheWorker) {
  testing::ForwardSeam seam;
  // Even an error that is not sticky: the device never ran a forward.
  seam.FailNext({absl::ResourceExhaustedError(testing::kCudaOutOfMemory)});
  TargetWorkerOptions options;
  options.before_forward_for_test = seam.hook();
  auto worker = MakeWorker(options);
  worker->Start();
  const absl::Status warm_up = worker->AwaitWarmUp();
  EXPECT_EQ(warm_up.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(warm_up.message(), "out of memory")) << warm_up;
  EXPECT_FALSE(worker->warmed_up());
  EXPECT_EQ(worker->poisoned().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StartsWith(worker->poisoned().message(),
                               "warm-up forward failed: libtorch: CUDA out"))
      << worker->poisoned();
  EXPECT_EQ(poison_events().size(), 1u);
  PendingVerify verify;
  worker->Verify({{1, 1, {1}}}, verify.callback());
  auto verified = verify.Get();
  ASSERT_TRUE(verified.has_value());
  EXPECT_EQ(verified->status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(verified->status().message(), "out of memory"))
      << verified->status();
}

TEST_F(TargetWorkerTest, StickyDeviceErrorPoisonsTheWorkerForGood) {
  testing::ForwardSeam seam;
  TargetWorkerOptions options;
  options.before_forward_for_test = seam.hook();
  auto worker = MakeWorker(options);
  worker->Start();
  ASSERT_TRUE(worker->AwaitWarmUp().ok());
  PendingPrefill ready;
  worker->Prefill({Item(1, {1, 2, 3})}, ready.callback());
  auto first = ready.Get();
  ASSERT_TRUE(first.has_value() && (*first)[0].ok());

  seam.FailNext({absl::InternalError(testing::kCudaIllegalAccess)});
  PendingVerify verify;
  worker->Verify({{1, 3, {*(*first)[0]}}}, verify.callback());
  auto verified = verify.Get();
  ASSERT_TRUE(verified.has_value());
  EXPECT_EQ(verified->status().code(), absl::StatusCode::kInternal);
  const int forwards = seam.forwards();

  // Poisoned: the listener heard it once, and every later call fails at
  // once with INTERNAL naming the original error, without a forward.
  const absl::Status poisoned = worker->poisoned();
  EXPECT_EQ(poisoned.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(poisoned.message(), "illegal memory access"))
      << poisoned;
  ASSERT_EQ(poison_events().size(), 1u);
  EXPECT_EQ(poison_events()[0], poisoned);
  PendingPrefill prefill;
  worker->Prefill({Item(2, {4, 5})}, prefill.callback());
  auto refused = prefill.Get();
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ((*refused)[0].status(), poisoned);
  PendingVerify again;
  worker->Verify({{1, 3, {1}}}, again.callback());
  auto verified_again = again.Get();
  ASSERT_TRUE(verified_again.has_value());
  EXPECT_EQ(verified_again->status(), poisoned);
  Pending<int> released;
  worker->Release({1}, released.callback());
  EXPECT_EQ(released.Get(), 0);
  EXPECT_EQ(seam.forwards(), forwards);
  EXPECT_EQ(poison_events().size(), 1u);
}

TEST_F(TargetWorkerTest, NonStickyErrorsDoNotPoison) {
  testing::ForwardSeam seam;
  TargetWorkerOptions options;
  options.before_forward_for_test = seam.hook();
  auto worker = MakeWorker(options);
  worker->Start();
  ASSERT_TRUE(worker->AwaitWarmUp().ok());
  seam.FailNext({absl::ResourceExhaustedError(testing::kCudaOutOfMemory),
                 absl::InternalError("libtorch: CUDA error: out of memory"),
                 absl::InternalError("libtorch: index out of range in self"),
                 absl::InvalidArgumentError("libtorch: CUDA error: made up")});
  for (int i = 0; i < 4; ++i) {
    PendingPrefill prefill;
    worker->Prefill({Item(10 + i, {1, 2, 3})}, prefill.callback());
    auto failed = prefill.Get();
    ASSERT_TRUE(failed.has_value());
    EXPECT_FALSE((*failed)[0].ok()) << i;
  }
  EXPECT_TRUE(worker->poisoned().ok()) << worker->poisoned();
  EXPECT_TRUE(poison_events().empty());
  PendingPrefill prefill;
  worker->Prefill({Item(1, {1, 2, 3})}, prefill.callback());
  auto first = prefill.Get();
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE((*first)[0].ok()) << (*first)[0].status();
}

TargetKeepIdleJob KeepIdleJob(std::vector<SequenceId> ids,
                              std::vector<SequenceId>* missing) {
  return {std::move(ids), [missing](std::vector<SequenceId> m) {
            if (missing != nullptr) *missing = std::move(m);
          }};
}

// One prefill call of one item through a whole step; its answer.
absl::StatusOr<int32_t> PrefillOne(TargetBatcher& batcher,
                                   TargetPrefillItem item) {
  PrefillAnswer answer;
  std::vector<TargetPrefillJob> jobs;
  jobs.push_back(PrefillJob({std::move(item)}, &answer));
  batcher.Step({}, std::move(jobs), {});
  while (!answer.called && batcher.has_prefills()) batcher.Step({}, {}, {});
  EXPECT_TRUE(answer.called);
  if (!answer.called) return absl::InternalError("not answered");
  return answer.results[0];
}

absl::StatusOr<std::vector<VerifyOutcome>> VerifyOne(TargetBatcher& batcher,
                                                     VerifyWork work) {
  VerifyAnswer answer;
  std::vector<TargetVerifyJob> jobs;
  jobs.push_back(VerifyJob({std::move(work)}, &answer));
  batcher.Step({}, {}, std::move(jobs));
  EXPECT_TRUE(answer.called);
  return answer.result;
}

// Sessions (docs/ARCHITECTURE.md §8): continuing a kept sequence keeps the
// first `start` cached tokens, drops the rest and prefills the new suffix;
// tokens, verify choices and published features then equal a fresh prefill
// of the whole new prompt, also when the suffix is chunked.
TEST_F(TargetBatcherTest, ContinuationEqualsAFreshPrefill) {
  for (int max_batch_tokens : {2048, 4}) {
    SCOPED_TRACE(max_batch_tokens);
    RecordingPublisher publisher;
    TargetWorkerOptions options;
    options.max_batch_tokens = max_batch_tokens;
    auto batcher = MakeBatcher(options, &publisher);
    const std::vector<int32_t> first = RandomPrompt(20, 128, 21);
    std::vector<int32_t> next(first.begin(), first.begin() + 12);
    for (int32_t t : RandomPrompt(9, 128, 22)) next.push_back(t);

    // Turn 1: prompt, one verified block (the cache then holds 20 + acc + 1).
    absl::StatusOr<int32_t> bonus = PrefillOne(*batcher, Item(1, first));
    ASSERT_TRUE(bonus.ok()) << bonus.status();
    auto verified = VerifyOne(*batcher, {1, 20, {*bonus, 5, 6, 7}});
    ASSERT_TRUE(verified.ok()) << verified.status();
    std::vector<SequenceId> missing = {99};
    batcher->ApplyKeepIdle({KeepIdleJob({1, 42}, &missing)});
    EXPECT_EQ(missing, std::vector<SequenceId>({42}));
    TargetWorkerSnapshot s = batcher->snapshot();
    EXPECT_EQ(s.idle_sequences, 1);
    EXPECT_EQ(s.idle_cached_tokens, 21 + (*verified)[0].accepted);
    EXPECT_EQ(s.reserved_tokens, s.idle_cached_tokens);

    // Turn 2 continues sequence 1 after the common prefix of 12 tokens;
    // sequence 2 prefills the same prompt from scratch.
    TargetPrefillItem cont =
        Item(1, std::vector<int32_t>(next.begin() + 12, next.end()), 40);
    cont.work.start = 12;
    absl::StatusOr<int32_t> continued = PrefillOne(*batcher, cont);
    ASSERT_TRUE(continued.ok()) << continued.status();
    absl::StatusOr<int32_t> fresh = PrefillOne(*batcher, Item(2, next));
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    EXPECT_EQ(*continued, *fresh);
    s = batcher->snapshot();
    EXPECT_EQ(s.idle_sequences, 0);
    EXPECT_EQ(s.reserved_tokens, 40 + 22);

    const std::vector<int32_t> block = {*fresh, 3, 9, 27, 81};
    auto a = VerifyOne(*batcher, {1, 21, block});
    auto b = VerifyOne(*batcher, {2, 21, block});
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ((*a)[0].target_tokens, (*b)[0].target_tokens);
    EXPECT_EQ((*a)[0].accepted, (*b)[0].accepted);

    // The drafter is sent the new rows from position 12 on (it cuts its
    // context back there), equal to the fresh prefill's rows.
    std::vector<RecordingPublisher::Event> ctx1 = publisher.ContextOf(1);
    size_t rewind = ctx1.size();
    for (size_t i = 0; i < ctx1.size(); ++i) {
      if (ctx1[i].start == 12) rewind = i;  // the last one: turn 2's
    }
    ASSERT_LT(rewind, ctx1.size());
    const std::vector<RecordingPublisher::Event> after(ctx1.begin() + rewind,
                                                       ctx1.end());
    const at::Tensor rows1 = Concat(after);
    const at::Tensor rows2 =
        Concat(publisher.ContextOf(2)).narrow(0, 12, 9 + 1 + (*a)[0].accepted);
    ASSERT_EQ(rows1.size(0), rows2.size(0));
    EXPECT_TRUE(at::allclose(rows1, rows2, 1e-4, 1e-4));
  }
}

TEST_F(TargetBatcherTest, ContinuationErrors) {
  TargetWorkerOptions options;
  options.kv_capacity_tokens = 100;
  auto batcher = MakeBatcher(options);
  ASSERT_TRUE(PrefillOne(*batcher, Item(1, RandomPrompt(10, 128, 1))).ok());
  batcher->ApplyKeepIdle({KeepIdleJob({1}, nullptr)});

  TargetPrefillItem unknown = Item(7, {1, 2, 3});
  unknown.work.start = 2;
  EXPECT_EQ(PrefillOne(*batcher, unknown).status().code(),
            absl::StatusCode::kNotFound);
  TargetPrefillItem past = Item(1, {1, 2, 3});
  past.work.start = 11;  // 10 cached
  EXPECT_EQ(PrefillOne(*batcher, past).status().code(),
            absl::StatusCode::kInvalidArgument);
  // More than the capacity: refused, and the kept sequence stays as it was.
  TargetPrefillItem big = Item(1, {1, 2, 3}, 101);
  big.work.start = 5;
  EXPECT_EQ(PrefillOne(*batcher, big).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(batcher->snapshot().num_sequences, 1);
  EXPECT_EQ(batcher->snapshot().idle_sequences, 1);
  EXPECT_EQ(batcher->snapshot().reserved_tokens, 10);
}

// When a prompt needs room, idle sequences are evicted least recently used
// first, and only as many as needed; running ones never. Nothing is
// evicted when even all idle ones would not make room.
TEST_F(TargetBatcherTest, IdleSequencesAreEvictedLeastRecentlyUsedFirst) {
  RecordingPublisher publisher;
  TargetWorkerOptions options;
  options.kv_capacity_tokens = 100;
  auto batcher = MakeBatcher(options, &publisher);
  for (SequenceId id : {1, 2, 3}) {
    ASSERT_TRUE(PrefillOne(*batcher, Item(id, RandomPrompt(20, 128, id))).ok());
  }
  // 2 went idle first, then 1; 3 is running.
  batcher->ApplyKeepIdle({KeepIdleJob({2}, nullptr)});
  batcher->ApplyKeepIdle({KeepIdleJob({1}, nullptr)});
  EXPECT_EQ(batcher->snapshot().reserved_tokens, 20 + 20 + 21);

  // 61 reserved: 39 free, 41 needed → the oldest idle one (2) goes.
  ASSERT_TRUE(PrefillOne(*batcher, Item(4, RandomPrompt(8, 128, 4), 41)).ok());
  EXPECT_TRUE(publisher.Released(2));
  EXPECT_FALSE(publisher.Released(1));
  TargetWorkerSnapshot s = batcher->snapshot();
  EXPECT_EQ(s.evicted_sequences, 1);
  EXPECT_EQ(s.num_sequences, 3);
  TargetPrefillItem cont = Item(2, {1, 2});
  cont.work.start = 5;
  EXPECT_EQ(PrefillOne(*batcher, cont).status().code(),
            absl::StatusCode::kNotFound);

  // 82 reserved (1 idle: 20); 40 needed > 18 free + 20 evictable: refused,
  // nothing evicted.
  EXPECT_EQ(PrefillOne(*batcher, Item(5, RandomPrompt(8, 128, 5), 40))
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(publisher.Released(1));
  EXPECT_EQ(batcher->snapshot().evicted_sequences, 1);
  // A continuation of the idle one may use its own reservation and more.
  TargetPrefillItem grow = Item(1, {1, 2, 3}, 35);
  grow.work.start = 20;
  EXPECT_TRUE(PrefillOne(*batcher, grow).ok());
  EXPECT_EQ(batcher->snapshot().reserved_tokens, 21 + 41 + 35);
}

}  // namespace
}  // namespace dedit
