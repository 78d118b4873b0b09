// DrafterWorker through its API on a tiny random pair: context applied in
// arrival order, drafts batched on the model thread, bounded waits for late
// context, gaps, releases, shutdown, the warm-up and poisoning by a sticky
// device error (injected through before_forward_for_test). The in-process
// DEditDrafter over the same weights is the reference for every draft.
#include "drafter_service/drafter_worker.h"

#include <ATen/Functions.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"

namespace dedit {
namespace {

using testing::MakeTinyPair;
using testing::RandomPrompt;
using testing::TestDevice;
using DraftResults = std::vector<absl::StatusOr<DraftResult>>;

using testing::Pending;

void ExpectSameDraft(const DraftResult& got, const DraftResult& want) {
  ASSERT_EQ(got.passes.size(), want.passes.size());
  for (size_t k = 0; k < got.passes.size(); ++k) {
    EXPECT_EQ(got.passes[k].tokens, want.passes[k].tokens) << "pass " << k;
    ASSERT_EQ(got.passes[k].confidences.size(),
              want.passes[k].confidences.size());
    for (size_t j = 0; j < got.passes[k].confidences.size(); ++j) {
      EXPECT_NEAR(got.passes[k].confidences[j], want.passes[k].confidences[j],
                  1e-5);
    }
  }
}

class DrafterWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = DefaultTinySpec();
    pair_ = MakeTinyPair(spec_, 21);
  }

  // A worker over a second copy of the pair's drafter; the pair's copy is
  // the in-process reference. Started unless `start` is false.
  std::unique_ptr<DrafterWorker> MakeWorker(DrafterWorkerOptions options,
                                            bool start = true) {
    DEditDrafter::Options opts;
    opts.device = TestDevice();
    auto drafter = DEditDrafter::Load(pair_->dir + "/drafter",
                                      pair_->target->embed_tokens(),
                                      pair_->target->lm_head(), opts);
    EXPECT_TRUE(drafter.ok()) << drafter.status();
    if (!drafter.ok()) return nullptr;
    auto worker = std::make_unique<DrafterWorker>(
        std::move(*drafter),
        [this](const DrafterBatchStats& s) {
          absl::MutexLock lock(&mu_);
          batches_.push_back(s);
        },
        options);
    worker->SetPoisonListener([this](const absl::Status& poisoned) {
      absl::MutexLock lock(&mu_);
      poison_events_.push_back(poisoned);
    });
    if (start) worker->Start();
    return worker;
  }

  // The target's context features of every prompt position.
  at::Tensor Features(const std::vector<int32_t>& prompt) {
    const SequenceId id = 900;
    EXPECT_TRUE(pair_->target->AddSequence(id).ok());
    auto out = pair_->target->Forward(
        {{id, prompt, 0, {static_cast<int>(prompt.size()) - 1}}});
    EXPECT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(pair_->target->RemoveSequence(id).ok());
    return out.ok() ? out->features : at::Tensor();
  }

  // The in-process drafter's answer for the same context and requests.
  std::vector<DraftResult> Reference(
      const std::vector<std::pair<SequenceId, at::Tensor>>& contexts,
      const std::vector<DraftRequest>& requests) {
    DEditDrafter& d = *pair_->drafter;
    for (const auto& [id, features] : contexts) {
      EXPECT_TRUE(d.AddSequence(id).ok());
      EXPECT_TRUE(d.AppendContext(id, 0, features).ok());
    }
    auto drafted = d.Draft(requests);
    EXPECT_TRUE(drafted.ok()) << drafted.status();
    for (const auto& [id, features] : contexts) {
      EXPECT_TRUE(d.RemoveSequence(id).ok());
    }
    return drafted.ok() ? *drafted : std::vector<DraftResult>();
  }

  // Returns once the worker has finished the pass that was running, so its
  // snapshot is current: releases are answered on the next pass, after the
  // previous pass published its snapshot.
  static void Sync(DrafterWorker& worker) {
    Pending<int> done;
    worker.Release({}, done.callback());
    done.Get();
  }

  std::vector<DrafterBatchStats> batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  std::vector<absl::Status> poison_events() {
    absl::MutexLock lock(&mu_);
    return poison_events_;
  }

  TinyModelSpec spec_;
  std::unique_ptr<testing::TinyPair> pair_;
  absl::Mutex mu_;
  std::vector<DrafterBatchStats> batches_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> poison_events_ ABSL_GUARDED_BY(mu_);
};

TEST_F(DrafterWorkerTest, DraftsMatchTheInProcessDrafter) {
  auto worker = MakeWorker(DrafterWorkerOptions());
  ASSERT_NE(worker, nullptr);
  const at::Tensor a = Features(RandomPrompt(9, 128, 1));
  const at::Tensor b = Features(RandomPrompt(17, 128, 2));
  // Context arrives in chunks, as the target streams it.
  worker->AddContext(1, 0, a.narrow(0, 0, 5));
  worker->AddContext(1, 5, a.narrow(0, 5, 4));
  worker->AddContext(2, 0, b);
  // The second carries a lookup seed (P1's input for slots 1..3).
  const std::vector<DraftRequest> requests = {
      {1, 9, 17, 8, 3}, {2, 17, 40, 16, 2, nullptr, {4, 5, 6}}};
  Pending<DraftResults> pending;
  worker->Draft(requests, pending.callback());
  auto results = pending.Get();
  ASSERT_TRUE(results.has_value());
  const std::vector<DraftResult> want = Reference({{1, a}, {2, b}}, requests);
  ASSERT_EQ(results->size(), 2u);
  ASSERT_EQ(want.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE((*results)[i].ok()) << (*results)[i].status();
    ExpectSameDraft(*(*results)[i], want[i]);
  }
  const auto stats = batches();
  ASSERT_EQ(stats.size(), 1u);  // one batched call for both sequences
  EXPECT_EQ(stats[0].sequences, 2);
  EXPECT_EQ(stats[0].max_passes, 3);
  EXPECT_EQ(stats[0].context_tokens, 26);
  // The job's waits, once for its two items; its context was there.
  ASSERT_EQ(stats[0].queue_wait_seconds.size(), 1u);
  ASSERT_EQ(stats[0].context_wait_seconds.size(), 1u);
  EXPECT_EQ(stats[0].context_wait_seconds[0], 0.0);
  Sync(*worker);
  EXPECT_EQ(worker->snapshot().num_sequences, 2);
  EXPECT_EQ(worker->snapshot().context_tokens, 26);
}

// Also with an idle spin longer than the test (common/base/spin_wait.h): the
// worker then polls while the draft waits for its context, and stopping
// still ends the poll (the worker is destroyed at the end).
class DrafterWorkerSpinTest : public DrafterWorkerTest,
                              public ::testing::WithParamInterface<int64_t> {};
INSTANTIATE_TEST_SUITE_P(IdleSpin, DrafterWorkerSpinTest,
                         ::testing::Values(0, 60'000'000));

TEST_P(DrafterWorkerSpinTest, DraftWaitsForContextThatArrivesLater) {
  DrafterWorkerOptions options;
  options.context_wait_ms = 60'000;
  options.idle_spin_us = GetParam();
  auto worker = MakeWorker(options);
  ASSERT_NE(worker, nullptr);
  const at::Tensor a = Features(RandomPrompt(12, 128, 3));
  worker->AddContext(1, 0, a.narrow(0, 0, 10));
  const std::vector<DraftRequest> requests = {{1, 12, 5, 6, 2}};
  Pending<DraftResults> pending;
  worker->Draft(requests, pending.callback());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(pending.ready());  // two committed rows are still on the wire
  worker->AddContext(1, 10, a.narrow(0, 10, 2));
  auto results = pending.Get();
  ASSERT_TRUE(results.has_value());
  ASSERT_TRUE((*results)[0].ok()) << (*results)[0].status();
  ExpectSameDraft(*(*results)[0], Reference({{1, a}}, requests)[0]);
  // The metrics say why the draft waited: for its context (the 100 ms
  // above), not for the model thread. One job, reported once.
  const std::vector<DrafterBatchStats> stats = batches();
  ASSERT_EQ(stats.size(), 1u);
  ASSERT_EQ(stats[0].context_wait_seconds.size(), 1u);
  ASSERT_EQ(stats[0].queue_wait_seconds.size(), 1u);
  // The two add up to the time from the call to the context's arrival;
  // the model thread's wake-up after the call is the queue's share.
  const double queue = stats[0].queue_wait_seconds[0];
  const double context = stats[0].context_wait_seconds[0];
  EXPECT_GE(queue + context, 0.1);
  EXPECT_LT(queue + context, 60.0);
  if (queue < 0.05) EXPECT_GT(context, 0.05);
}

TEST_F(DrafterWorkerTest, BadOrUnservableRequestsFailAlone) {
  DrafterWorkerOptions options;
  options.context_wait_ms = 50;
  options.max_passes = 4;
  auto worker = MakeWorker(options);
  ASSERT_NE(worker, nullptr);
  worker->AddContext(1, 0, Features(RandomPrompt(6, 128, 4)));
  Pending<DraftResults> pending;
  // A seed (DraftItem.seed, from the wire) longer than W-1, or with an id
  // outside the vocabulary.
  DraftRequest long_seed{1, 6, 3, 4, 1};
  long_seed.seed = {5, 6, 7, 8};
  DraftRequest bad_seed{1, 6, 3, 4, 1};
  bad_seed.seed = {5, -1};
  worker->Draft({{1, 6, 3, 4, 1},
                 {1, 6, 3, 1, 1},    // W < 2
                 {1, 6, 3, 33, 1},   // W above the block size
                 {1, 6, 3, 4, 5},    // K above max_passes
                 {1, 6, 128, 4, 1},  // bonus outside the vocabulary
                 {1, 4, 3, 4, 1},    // behind the context
                 {7, 0, 3, 4, 1},    // no context ever arrives
                 long_seed,
                 bad_seed},
                pending.callback());
  auto results = pending.Get();
  ASSERT_TRUE(results.has_value());
  ASSERT_EQ(results->size(), 9u);
  EXPECT_TRUE((*results)[0].ok()) << (*results)[0].status();
  for (int i : {1, 2, 3, 4, 7, 8}) {
    EXPECT_EQ((*results)[i].status().code(), absl::StatusCode::kInvalidArgument)
        << i;
  }
  EXPECT_EQ((*results)[5].status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*results)[6].status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(DrafterWorkerTest, ContextGapFailsDraftsWithDataLossUntilRestarted) {
  DrafterWorkerOptions options;
  options.context_wait_ms = 50;
  auto worker = MakeWorker(options);
  ASSERT_NE(worker, nullptr);
  const at::Tensor a = Features(RandomPrompt(9, 128, 5));
  worker->AddContext(1, 0, a.narrow(0, 0, 4));
  worker->AddContext(1, 6, a.narrow(0, 6, 3));  // rows 4..5 were lost
  worker->AddContext(2, 3, a.narrow(0, 3, 6));  // its start was lost
  Pending<DraftResults> lost;
  worker->Draft({{1, 9, 3, 4, 1}, {2, 9, 3, 4, 1}}, lost.callback());
  auto results = lost.Get();
  ASSERT_TRUE(results.has_value());
  EXPECT_EQ((*results)[0].status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ((*results)[1].status().code(), absl::StatusCode::kDataLoss);

  // A prompt's first chunk (start 0) recreates the sequence.
  worker->AddContext(1, 0, a);
  Pending<DraftResults> again;
  worker->Draft({{1, 9, 3, 4, 1}}, again.callback());
  results = again.Get();
  ASSERT_TRUE(results.has_value());
  EXPECT_TRUE((*results)[0].ok()) << (*results)[0].status();
}

// A sequence's context never exceeds the model's
// positions; more is refused by name and drops only that sequence.
TEST_F(DrafterWorkerTest, ContextPastTheMaxPositionsIsRefused) {
  DrafterWorkerOptions options;
  options.context_wait_ms = 50;
  auto worker = MakeWorker(options);
  ASSERT_NE(worker, nullptr);
  const int64_t limit = worker->max_context_tokens();
  EXPECT_EQ(limit, spec_.target.max_position_embeddings);
  DEditDrafter& d = *pair_->drafter;
  ASSERT_TRUE(d.AddSequence(5).ok());
  const at::Tensor rows = at::zeros({limit + 1, d.feature_width()});
  const absl::Status refused = d.AppendContext(5, 0, rows);
  EXPECT_EQ(refused.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(absl::StrContains(refused.message(), "limit")) << refused;
  EXPECT_EQ(d.ContextLength(5).value_or(-1), 0);
  ASSERT_TRUE(d.RemoveSequence(5).ok());

  // Through the worker: the oversized sequence's drafts fail, others draft.
  const at::Tensor a = Features(RandomPrompt(9, 128, 5));
  worker->AddContext(1, 0, rows);
  worker->AddContext(2, 0, a);
  Pending<DraftResults> drafts;
  worker->Draft({{1, limit + 1, 3, 4, 1}, {2, 9, 3, 4, 1}}, drafts.callback());
  auto results = drafts.Get();
  ASSERT_TRUE(results.has_value());
  EXPECT_FALSE((*results)[0].ok());
  EXPECT_TRUE((*results)[1].ok()) << (*results)[1].status();
  Sync(*worker);
  EXPECT_EQ(worker->snapshot().context_tokens, 9);
}

// Context events that reach the model thread together are appended in one
// batched call; every kind of event among them keeps its meaning and its
// order: chunks that continue each other, a session's chunk that cuts the
// context back, a release and a new first chunk, a gap, a stream's end.
TEST_F(DrafterWorkerTest, ContextTakenTogetherKeepsEveryEventsMeaning) {
  DrafterWorkerOptions options;
  options.context_wait_ms = 50;
  // Not started: every event below is in the model thread's first inbox.
  auto worker = MakeWorker(options, /*start=*/false);
  ASSERT_NE(worker, nullptr);
  const at::Tensor a = Features(RandomPrompt(9, 128, 11));
  const at::Tensor b = Features(RandomPrompt(8, 128, 12));
  const at::Tensor c = Features(RandomPrompt(7, 128, 13));
  worker->AddContext(1, 0, a.narrow(0, 0, 5));
  worker->AddContext(2, 0, b.narrow(0, 0, 6));
  worker->AddContext(3, 0, c.narrow(0, 0, 4));
  worker->AddContext(4, 0, a.narrow(0, 0, 4));
  worker->AddContext(5, 0, a.narrow(0, 0, 5), /*stream=*/7);
  worker->AddContext(1, 5, a.narrow(0, 5, 4));
  worker->AddContext(2, 3, b.narrow(0, 3, 5));  // keeps 3, re-prefills
  worker->ReleaseFromStream(3);
  worker->AddContext(3, 0, c);
  worker->AddContext(4, 6, a.narrow(0, 6, 3));  // rows 4..5 were lost
  worker->EndStream(7);
  worker->Start();
  const std::vector<DraftRequest> requests = {{1, 9, 17, 8, 2},
                                              {2, 8, 40, 6, 1},
                                              {3, 7, 5, 16, 3},
                                              {4, 9, 3, 4, 1},
                                              {5, 5, 3, 4, 1}};
  Pending<DraftResults> pending;
  worker->Draft(requests, pending.callback());
  auto results = pending.Get();
  ASSERT_TRUE(results.has_value());
  ASSERT_EQ(results->size(), 5u);
  const std::vector<DraftResult> want = Reference(
      {{1, a}, {2, b}, {3, c}}, {requests.begin(), requests.begin() + 3});
  ASSERT_EQ(want.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE((*results)[i].ok()) << i << ": " << (*results)[i].status();
    ExpectSameDraft(*(*results)[i], want[i]);
  }
  EXPECT_EQ((*results)[3].status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ((*results)[4].status().code(), absl::StatusCode::kUnavailable);
  Sync(*worker);
  EXPECT_EQ(worker->snapshot().num_sequences, 3);
  EXPECT_EQ(worker->snapshot().context_tokens, 9 + 8 + 7);
  EXPECT_EQ(worker->snapshot().orphaned_contexts, 1);
}

// The snapshot listener (which feeds the context
// gauge) hears of context and of releases, not only of drafts.
TEST_F(DrafterWorkerTest, SnapshotListenerHearsOfReleases) {
  auto worker = MakeWorker(DrafterWorkerOptions(), /*start=*/false);
  ASSERT_NE(worker, nullptr);
  absl::Mutex mu;
  std::vector<DrafterWorker::Snapshot> heard;
  worker->SetSnapshotListener([&](const DrafterWorker::Snapshot& s) {
    absl::MutexLock lock(&mu);
    heard.push_back(s);
  });
  // Polls until the last snapshot heard has `tokens` context tokens (the
  // listener runs after the pass's answers, so no Sync bounds it).
  auto heard_tokens = [&](int64_t tokens) {
    for (int i = 0; i < 400; ++i) {
      {
        absl::MutexLock lock(&mu);
        if (!heard.empty() && heard.back().context_tokens == tokens) {
          return true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  };
  worker->Start();
  worker->AddContext(1, 0, Features(RandomPrompt(7, 128, 3)));
  EXPECT_TRUE(heard_tokens(7));
  worker->ReleaseFromStream(1);
  EXPECT_TRUE(heard_tokens(0));
  worker->Stop();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(heard.back().num_sequences, 0);
}

TEST_F(DrafterWorkerTest, ReleaseDropsTheContext) {
  DrafterWorkerOptions options;
  options.context_wait_ms = 50;
  auto worker = MakeWorker(options);
  ASSERT_NE(worker, nullptr);
  worker->AddContext(1, 0, Features(RandomPrompt(5, 128, 6)));
  worker->AddContext(2, 0, Features(RandomPrompt(7, 128, 7)));
  Pending<int> released;
  worker->Release({1, 3}, released.callback());
  EXPECT_EQ(released.Get(), 1);  // 3 never existed
  Sync(*worker);
  EXPECT_EQ(worker->snapshot().num_sequences, 1);
  EXPECT_EQ(worker->snapshot().context_tokens, 7);

  // The target's release marker, in stream order.
  worker->ReleaseFromStream(2);
  Pending<DraftResults> pending;
  worker->Draft({{2, 7, 3, 4, 1}}, pending.callback());
  auto results = pending.Get();
  ASSERT_TRUE(results.has_value());
  EXPECT_EQ((*results)[0].status().code(), absl::StatusCode::kUnavailable);
  Sync(*worker);
  EXPECT_EQ(worker->snapshot().num_sequences, 0);
  EXPECT_EQ(worker->snapshot().context_tokens, 0);
}

TEST_F(DrafterWorkerTest, StopAnswersWaitingDraftsUnavailable) {
  DrafterWorkerOptions options;
  options.context_wait_ms = 60'000;
  auto worker = MakeWorker(options);
  ASSERT_NE(worker, nullptr);
  Pending<DraftResults> waiting;
  worker->Draft({{1, 4, 3, 4, 1}}, waiting.callback());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  worker->Stop();
  auto results = waiting.Get();
  ASSERT_TRUE(results.has_value());
  EXPECT_EQ((*results)[0].status().code(), absl::StatusCode::kUnavailable);
  Pending<DraftResults> late;
  worker->Draft({{1, 4, 3, 4, 1}}, late.callback());
  results = late.Get();
  ASSERT_TRUE(results.has_value());
  EXPECT_EQ((*results)[0].status().code(), absl::StatusCode::kUnavailable);
  Pending<int> released;
  worker->Release({1}, released.callback());
  EXPECT_EQ(released.Get(), 0);
}

TEST_F(DrafterWorkerTest, WarmUpDraftRunsBeforeTheWorkerIsWarm) {
  testing::ForwardSeam seam;
  DrafterWorkerOptions options;
  options.before_forward_for_test = seam.hook();
  auto worker = MakeWorker(options, /*start=*/false);
  ASSERT_NE(worker, nullptr);
  EXPECT_EQ(worker->AwaitWarmUp().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(worker->warmed_up());
  EXPECT_EQ(seam.forwards(), 0);
  seam.HoldNext();
  worker->Start();
  ASSERT_TRUE(seam.AwaitHeld());  // the warm-up draft, on the thread
  EXPECT_FALSE(worker->warmed_up());
  seam.Resume();
  EXPECT_TRUE(worker->AwaitWarmUp().ok());
  EXPECT_TRUE(worker->warmed_up());
  EXPECT_EQ(seam.forwards(), 1);
  EXPECT_TRUE(batches().empty());  // the warm-up is not a metric
  Sync(*worker);
  EXPECT_EQ(worker->snapshot().num_sequences, 0);  // nothing left behind
  EXPECT_EQ(worker->snapshot().context_tokens, 0);
  // And the worker drafts as usual.
  const at::Tensor a = Features(RandomPrompt(9, 128, 8));
  worker->AddContext(1, 0, a);
  Pending<DraftResults> pending;
  worker->Draft({{1, 9, 3, 4, 2}}, pending.callback());
  auto results = pending.Get();
  ASSERT_TRUE(results.has_value());
  ASSERT_TRUE((*results)[0].ok()) << (*results)[0].status();
  ExpectSameDraft(*(*results)[0], Reference({{1, a}}, {{1, 9, 3, 4, 2}})[0]);
}

// One caller flooding the drafter with items gets a share of
// each forward, not all of it; another caller's draft goes out in the next
// forward instead of waiting behind the flood (or riding one huge
// forward), and every draft still equals the in-process drafter's.
TEST_F(DrafterWorkerTest, AFloodFromOneCallerDoesNotStarveAnother) {
  DrafterWorkerOptions options;
  options.context_wait_ms = 60'000;
  options.max_batch_sequences = 4;
  auto worker = MakeWorker(options);
  ASSERT_NE(worker, nullptr);
  const int kFlood = 40;
  std::vector<std::pair<SequenceId, at::Tensor>> contexts;
  std::vector<DraftRequest> flood;
  for (int i = 0; i < kFlood; ++i) {
    const SequenceId id = 1 + i;
    contexts.emplace_back(id, Features(RandomPrompt(6, 128, 200 + i)));
    flood.push_back({id, 6, 3, 4, 1});
  }
  const at::Tensor victim_context = Features(RandomPrompt(6, 128, 300));
  const std::vector<DraftRequest> victim = {{100, 6, 5, 4, 1}};
  // Everything but the last row of sequence 1 and of the victim's
  // sequence: neither job can run yet.
  for (const auto& [id, features] : contexts) {
    worker->AddContext(id, 0, id == 1 ? features.narrow(0, 0, 5) : features);
  }
  worker->AddContext(100, 0, victim_context.narrow(0, 0, 5));
  Pending<DraftResults> flood_done;
  worker->Draft(flood, flood_done.callback(), "router-a");
  std::atomic<size_t> forwards_before_victim{0};
  std::atomic<bool> flood_answered_first{false};
  Pending<DraftResults> victim_done;
  auto victim_callback = victim_done.callback();
  worker->Draft(
      victim,
      [&](DraftResults r) {
        forwards_before_victim = batches().size();
        flood_answered_first = flood_done.ready();
        victim_callback(std::move(r));
      },
      "router-b");
  // The flood becomes ready first.
  worker->AddContext(1, 5, contexts[0].second.narrow(0, 5, 1));
  worker->AddContext(100, 5, victim_context.narrow(0, 5, 1));

  auto victim_results = victim_done.Get();
  auto flood_results = flood_done.Get();
  ASSERT_TRUE(victim_results.has_value());
  ASSERT_TRUE(flood_results.has_value());
  EXPECT_FALSE(flood_answered_first.load());
  // The flood alone needs kFlood / 4 = 10 forwards; the victim is in the
  // first or second.
  EXPECT_LE(forwards_before_victim.load(), 2u);
  const auto stats = batches();
  EXPECT_GE(stats.size(), static_cast<size_t>(kFlood / 4));
  for (const DrafterBatchStats& b : stats) EXPECT_LE(b.sequences, 4);

  ASSERT_TRUE((*victim_results)[0].ok()) << (*victim_results)[0].status();
  ExpectSameDraft(*(*victim_results)[0],
                  Reference({{100, victim_context}}, victim)[0]);
  const std::vector<DraftResult> want = Reference(contexts, flood);
  ASSERT_EQ(flood_results->size(), flood.size());
  for (size_t i = 0; i < flood.size(); ++i) {
    ASSERT_TRUE((*flood_results)[i].ok()) << (*flood_results)[i].status();
    ExpectSameDraft(*(*flood_results)[i], want[i]);
  }
}

TEST_F(DrafterWorkerTest, FailedWarmUpPoisonsTheWorker) {
  testing::ForwardSeam seam;
  seam.FailNext(
      {absl::InternalError("libtorch: CUDA error: no kernel image "
                           "is available for execution on the "
                           "device")});
  DrafterWorkerOptions options;
  options.before_forward_for_test = seam.hook();
  auto worker = MakeWorker(options);
  ASSERT_NE(worker, nullptr);
  const absl::Status warm_up = worker->AwaitWarmUp();
  EXPECT_EQ(warm_up.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(warm_up.message(), "no kernel image"))
      << warm_up;
  EXPECT_EQ(worker->poisoned().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(poison_events().size(), 1u);
}

TEST_F(DrafterWorkerTest, StickyDeviceErrorPoisonsTheWorkerForGood) {
  testing::ForwardSeam seam;
  DrafterWorkerOptions options;
  options.before_forward_for_test = seam.hook();
  auto worker = MakeWorker(options);
  ASSERT_NE(worker, nullptr);
  ASSERT_TRUE(worker->AwaitWarmUp().ok());
  const at::Tensor a = Features(RandomPrompt(9, 128, 9));
  worker->AddContext(1, 0, a);
  seam.FailNext({absl::InternalError(testing::kCudaIllegalAccess)});
  Pending<DraftResults> failed;
  worker->Draft({{1, 9, 3, 4, 1}}, failed.callback());
  auto results = failed.Get();
  ASSERT_TRUE(results.has_value());
  EXPECT_EQ((*results)[0].status().code(), absl::StatusCode::kInternal);
  const int forwards = seam.forwards();

  const absl::Status poisoned = worker->poisoned();
  EXPECT_EQ(poisoned.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(poisoned.message(), "illegal memory access"))
      << poisoned;
  ASSERT_EQ(poison_events().size(), 1u);
  EXPECT_EQ(poison_events()[0], poisoned);
  worker->AddContext(2, 0, a);  // dropped
  Pending<DraftResults> again;
  worker->Draft({{1, 9, 3, 4, 1}, {2, 9, 3, 4, 1}}, again.callback());
  results = again.Get();
  ASSERT_TRUE(results.has_value());
  ASSERT_EQ(results->size(), 2u);
  EXPECT_EQ((*results)[0].status(), poisoned);
  EXPECT_EQ((*results)[1].status(), poisoned);
  Pending<int> released;
  worker->Release({1}, released.callback());
  EXPECT_EQ(released.Get(), 0);
  EXPECT_EQ(seam.forwards(), forwards);
  EXPECT_EQ(poison_events().size(), 1u);
}

TEST_F(DrafterWorkerTest, NonStickyErrorsDoNotPoison) {
  testing::ForwardSeam seam;
  DrafterWorkerOptions options;
  options.before_forward_for_test = seam.hook();
  auto worker = MakeWorker(options);
  ASSERT_NE(worker, nullptr);
  ASSERT_TRUE(worker->AwaitWarmUp().ok());
  worker->AddContext(1, 0, Features(RandomPrompt(6, 128, 10)));
  seam.FailNext({absl::ResourceExhaustedError(testing::kCudaOutOfMemory),
                 absl::InternalError("libtorch: CUDA error: out of memory"),
                 absl::InvalidArgumentError("libtorch: CUDA error: made up")});
  for (int i = 0; i < 3; ++i) {
    Pending<DraftResults> pending;
    worker->Draft({{1, 6, 3, 4, 1}}, pending.callback());
    auto results = pending.Get();
    ASSERT_TRUE(results.has_value());
    EXPECT_FALSE((*results)[0].ok()) << i;
  }
  EXPECT_TRUE(worker->poisoned().ok()) << worker->poisoned();
  EXPECT_TRUE(poison_events().empty());
  Pending<DraftResults> pending;
  worker->Draft({{1, 6, 3, 4, 1}}, pending.callback());
  auto results = pending.Get();
  ASSERT_TRUE(results.has_value());
  EXPECT_TRUE((*results)[0].ok()) << (*results)[0].status();
}

}  // namespace
}  // namespace dedit
