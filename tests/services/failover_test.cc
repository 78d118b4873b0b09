// Failover: a dying stack loses no stream. Three stacks (a dedit-target
// streaming context to its dedit-drafter each) behind one router, all
// real processes on loopback; targets are SIGKILLed mid-load. Every stream
// moves to a stack that takes it (or waits for its own target to restart),
// is prefilled there with its prompt and every token it had streamed, and
// completes exactly as an uninterrupted run: the target's greedy output at
// temperature 0, the same seeded sample at 0.8. Survivors hold nothing
// afterwards (router/stack_set.h "Failover", router/stream_progress.h).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/in_process.h"
#include "dedit/v1/services.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"
#include "tests/services/service_cluster.h"
#include "tests/services/stream_client.h"

namespace dedit {
namespace {

using testing::ConcurrentStreams;
using ::testing::ElementsAreArray;
using testing::Generate;
using testing::Generated;
using testing::IdsRequest;
using testing::RandomPrompt;
using testing::ServiceCluster;
using testing::SessionClient;
using testing::StackCluster;
using testing::TokensTurn;
using testing::WaitFor;

constexpr int kWindow = 8;
constexpr int kPasses = 2;

class FailoverTest : public ::testing::Test {
 protected:
  void SetUp() override { StartCluster({.stacks = 3, .routers = 1}); }
  void StartCluster(StackCluster::Options options) {
    cluster_ = std::make_unique<StackCluster>(std::move(options));
    const absl::Status started = cluster_->Start();
    ASSERT_TRUE(started.ok()) << started;
    stub_ = v1::Generation::NewStub(cluster_->RouterChannel(0));
    for (int i = 0; i < cluster_->num_stacks(); ++i) {
      ASSERT_TRUE(WaitFor(
          [&] { return StackMetric("dedit_stack_reachable", i) == 1; }, 20000))
          << "the router never reached stack " << i;
    }
    InProcessStack::Options o;
    o.target_dir = cluster_->target_dir();
    o.drafter_dir = cluster_->drafter_dir();
    auto stack = InProcessStack::Load(o);
    ASSERT_TRUE(stack.ok()) << stack.status();
    reference_ = std::move(*stack);
  }

  std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int n) {
    return testing::GreedyReference(reference_->target(), prompt, n);
  }
  std::string Metrics() {
    return ServiceCluster::Scrape(cluster_->router(0)->metrics_port())
        .value_or("");
  }
  double Metric(const std::string& name, const std::string& label = "") {
    return ServiceCluster::MetricValue(Metrics(), name, label);
  }
  double StackMetric(const std::string& name, int stack) {
    return Metric(
        name, absl::StrCat("stack=\"", StackCluster::StackName(stack), "\""));
  }
  // The stack with the most requests running on it.
  int Busiest() {
    int best = 0;
    for (int i = 1; i < cluster_->num_stacks(); ++i) {
      if (StackMetric("dedit_stack_requests_running", i) >
          StackMetric("dedit_stack_requests_running", best)) {
        best = i;
      }
    }
    return best;
  }
  v1::TargetInfoResponse TargetInfo(int i) {
    auto stub = v1::Target::NewStub(cluster_->TargetChannel(i));
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::TargetInfoResponse info;
    EXPECT_TRUE(stub->Info(&c, {}, &info).ok()) << "stack " << i;
    return info;
  }
  int DrafterSequences(int i) {
    auto stub = v1::Drafter::NewStub(cluster_->DrafterChannel(i));
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::DrafterInfoResponse info;
    EXPECT_TRUE(stub->Info(&c, {}, &info).ok()) << "stack " << i;
    return info.num_sequences();
  }
  // Nothing left on stack i's target (sequences, reservations) or drafter.
  void ExpectEmpty(int i) {
    EXPECT_TRUE(WaitFor(
        [&] {
          const v1::TargetInfoResponse info = TargetInfo(i);
          return info.num_sequences() == 0 && info.reserved_tokens() == 0;
        },
        5000))
        << "stack " << i << " target: " << TargetInfo(i).num_sequences()
        << " sequences, " << TargetInfo(i).reserved_tokens() << " reserved";
    EXPECT_TRUE(WaitFor([&] { return DrafterSequences(i) == 0; }, 5000))
        << "stack " << i << " drafter: " << DrafterSequences(i);
  }

  // `n` requests of `new_tokens` each, speculative, at `temperature`
  // (seeded per request when > 0).
  static std::vector<v1::GenerateRequest> Requests(
      const std::vector<std::vector<int32_t>>& prompts, int new_tokens,
      float temperature) {
    std::vector<v1::GenerateRequest> out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      v1::GenerateRequest r =
          IdsRequest(prompts[i], new_tokens, kWindow, kPasses);
      if (temperature > 0) {
        r.mutable_sampling()->set_temperature(temperature);
        r.mutable_sampling()->set_has_seed(true);
        r.mutable_sampling()->set_seed(7000 + i);
      }
      out.push_back(std::move(r));
    }
    return out;
  }

  // Streams `requests`; once every one has tokens, SIGKILLs the target of
  // the busiest stack. Returns the results and that stack.
  std::vector<Generated> RunAndKillATarget(
      const std::vector<v1::GenerateRequest>& requests, int* victim) {
    ConcurrentStreams streams(stub_.get(), requests);
    EXPECT_TRUE(WaitFor(
        [&] { return streams.started.load() == int(requests.size()); }, 60000));
    *victim = Busiest();
    running_on_victim_ = StackMetric("dedit_stack_requests_running", *victim);
    cluster_->KillTarget(*victim);
    streams.Join();
    return streams.results;
  }

  void Report(const char* what, const std::vector<Generated>& results,
              int equal) {
    double stall = 0;
    for (const Generated& g : results)
      stall = std::max(stall, g.max_gap_seconds);
    std::printf(
        "[ failover ] %s: %.0f streams on the killed stack, %zu/%zu "
        "completed, %d identical; resumed %.0f (reason target_failed), "
        "%.0f tokens re-prefilled, stall per move %.3f s mean (longest gap "
        "a client saw %.3f s)\n",
        what, running_on_victim_,
        static_cast<size_t>(
            std::count_if(results.begin(), results.end(),
                          [](const Generated& g) { return g.status.ok(); })),
        results.size(), equal,
        Metric("dedit_stream_resumed_total", "reason=\"target_failed\""),
        Metric("dedit_stream_reprefilled_tokens_total"),
        Metric("dedit_stream_resume_seconds_sum") /
            std::max(1.0, Metric("dedit_stream_resume_seconds_count")),
        stall);
  }

  std::unique_ptr<StackCluster> cluster_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::unique_ptr<InProcessStack> reference_;
  double running_on_victim_ = 0;
};

// The headline: 12 greedy streams on 3 stacks, one target killed mid-load:
// all 12 complete, token for token the target's greedy output; the
// survivors and the dead target's drafter hold nothing afterwards.
TEST_F(FailoverTest, GreedyStreamsOutliveAKilledTarget) {
  constexpr int kStreams = 12, kNew = 160;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kStreams; ++i) {
    prompts.push_back(RandomPrompt(6, 300, 1100 + i));
  }
  int victim = -1;
  const std::vector<Generated> results =
      RunAndKillATarget(Requests(prompts, kNew, 0), &victim);
  int equal = 0;
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok())
        << i << ": " << results[i].status.error_message();
    EXPECT_THAT(results[i].tokens, ElementsAreArray(Greedy(prompts[i], kNew)))
        << i;
    if (results[i].tokens == Greedy(prompts[i], kNew)) ++equal;
    EXPECT_EQ(results[i].last.usage().completion_tokens(), kNew);
    EXPECT_EQ(results[i].last.usage().prompt_tokens(), 6);
  }
  Report("greedy", results, equal);
  EXPECT_GE(running_on_victim_, 1);
  EXPECT_EQ(Metric("dedit_stream_resumed_total", "reason=\"target_failed\""),
            running_on_victim_);
  EXPECT_GT(Metric("dedit_stream_reprefilled_tokens_total"),
            running_on_victim_ * 6);
  EXPECT_EQ(Metric("dedit_requests_total", "status=\"unavailable\""), 0);
  for (int i = 0; i < cluster_->num_stacks(); ++i) {
    if (i != victim) ExpectEmpty(i);
  }
  // The dead target's drafter was told to release the streams that left.
  EXPECT_TRUE(WaitFor([&] { return DrafterSequences(victim) == 0; }, 5000));
}

// Seeded sampling (T = 0.8): each draw is a function of (seed, position),
// so the streams that moved equal an uninterrupted run with the same
// seeds.
TEST_F(FailoverTest, SeededSampledStreamsOutliveAKilledTarget) {
  constexpr int kStreams = 12, kNew = 160;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kStreams; ++i) {
    prompts.push_back(RandomPrompt(6, 300, 1200 + i));
  }
  const std::vector<v1::GenerateRequest> requests =
      Requests(prompts, kNew, 0.8f);
  std::vector<Generated> uninterrupted;
  {
    ConcurrentStreams streams(stub_.get(), requests);
    streams.Join();
    uninterrupted = streams.results;
  }
  int victim = -1;
  const std::vector<Generated> results = RunAndKillATarget(requests, &victim);
  int equal = 0;
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(uninterrupted[i].status.ok())
        << uninterrupted[i].status.error_message();
    ASSERT_TRUE(results[i].status.ok())
        << i << ": " << results[i].status.error_message();
    ASSERT_EQ(results[i].tokens.size(), static_cast<size_t>(kNew));
    EXPECT_EQ(results[i].tokens, uninterrupted[i].tokens) << i;
    if (results[i].tokens == uninterrupted[i].tokens) ++equal;
  }
  Report("seeded T=0.8", results, equal);
  EXPECT_GE(running_on_victim_, 1);
  // Sampled, not greedy: the seeds matter.
  int differ_from_greedy = 0;
  for (int i = 0; i < kStreams; ++i) {
    if (results[i].tokens != Greedy(prompts[i], kNew)) ++differ_from_greedy;
  }
  EXPECT_GT(differ_from_greedy, 0);
  for (int i = 0; i < cluster_->num_stacks(); ++i) {
    if (i != victim) ExpectEmpty(i);
  }
}

// The only stack left (the other targets are down) has its target killed
// and restarted on the same address within 10 s: its streams wait, are
// prefilled on the restarted target once it answers, and complete
// identical to the target's greedy output.
TEST_F(FailoverTest, StreamsWaitForTheirRestartedTarget) {
  constexpr int kStreams = 6, kNew = 240;
  cluster_->KillTarget(1);
  cluster_->KillTarget(2);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kStreams; ++i) {
    prompts.push_back(RandomPrompt(6, 300, 1300 + i));
  }
  ConcurrentStreams streams(stub_.get(), Requests(prompts, kNew, 0));
  ASSERT_TRUE(
      WaitFor([&] { return streams.started.load() == kStreams; }, 60000));
  running_on_victim_ = StackMetric("dedit_stack_requests_running", 0);
  cluster_->KillTarget(0);
  const auto killed = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_TRUE(cluster_->RestartTarget(0).ok());
  const double restart_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed)
          .count();
  EXPECT_LT(restart_seconds, 10);
  streams.Join();
  int equal = 0;
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(streams.results[i].status.ok())
        << i << ": " << streams.results[i].status.error_message();
    EXPECT_THAT(streams.results[i].tokens,
                ElementsAreArray(Greedy(prompts[i], kNew)))
        << i;
    if (streams.results[i].tokens == Greedy(prompts[i], kNew)) ++equal;
  }
  std::printf("[ failover ] target down %.1f s (killed, restarted)\n",
              restart_seconds);
  Report("restarted target", streams.results, equal);
  EXPECT_EQ(running_on_victim_, kStreams);
  EXPECT_GE(Metric("dedit_stream_resumed_total", "reason=\"target_failed\""),
            kStreams);
  ExpectEmpty(0);
}

// Two stacks whose targets hold 4 streams each (KV reserved for the whole
// life: 6 + 400 + 8 tokens); one target dies with 4 running: the survivor
// refuses them for KV at first, so they queue, and are prefilled there as
// its own streams finish; all 8 complete identically.
class FailoverKvTest : public FailoverTest {
 protected:
  void SetUp() override {
    StartCluster({.stacks = 2,
                  .routers = 1,
                  .target_flags = {"--kv_capacity_tokens=1660"}});
  }
};

TEST_F(FailoverKvTest, StreamsQueueForKvRoomOnTheSurvivor) {
  constexpr int kStreams = 8, kNew = 400;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kStreams; ++i) {
    prompts.push_back(RandomPrompt(6, 300, 1500 + i));
  }
  int victim = -1;
  const std::vector<Generated> results =
      RunAndKillATarget(Requests(prompts, kNew, 0), &victim);
  int equal = 0;
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok())
        << i << ": " << results[i].status.error_message();
    EXPECT_THAT(results[i].tokens, ElementsAreArray(Greedy(prompts[i], kNew)))
        << i;
    if (results[i].tokens == Greedy(prompts[i], kNew)) ++equal;
  }
  Report("survivor out of KV", results, equal);
  const int survivor = 1 - victim;
  EXPECT_EQ(running_on_victim_, 4);
  // Refused for KV on the survivor (and queued) at least once.
  EXPECT_GE(Metric("dedit_stack_requests_total",
                   absl::StrCat("stack=\"", StackCluster::StackName(survivor),
                                "\",status=\"rerouted\"")),
            1);
  EXPECT_EQ(Metric("dedit_stream_resumed_total", "reason=\"target_failed\""),
            4);
  ExpectEmpty(survivor);
}

// A 4-turn session whose stack dies between turns 2 and 3: the history is
// in the router, so turn 3 rebuilds the cache on another stack (cache_lost
// reported), and turns 3-4 equal the target's greedy decoding of the
// whole history.
TEST_F(FailoverTest, SessionOutlivesItsStack) {
  constexpr int kNew = 12;
  SessionClient session(stub_.get());
  v1::SessionOpen open;
  open.set_ignore_eos(true);
  open.set_window(kWindow);
  open.set_passes(kPasses);
  ASSERT_TRUE(session.Open(open));
  std::vector<int32_t> history;
  int holder = -1;
  for (int turn = 1; turn <= 4; ++turn) {
    SCOPED_TRACE(turn);
    if (turn == 3) {
      for (int i = 0; i < cluster_->num_stacks(); ++i) {
        if (TargetInfo(i).num_sequences() == 1) holder = i;
      }
      ASSERT_GE(holder, 0) << "no stack holds the session";
      cluster_->KillStack(holder);
    }
    const std::vector<int32_t> input = RandomPrompt(5 + turn, 300, 40 + turn);
    const Generated g = session.Turn(TokensTurn(input, kNew));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    ASSERT_TRUE(g.last.finished());
    history.insert(history.end(), input.begin(), input.end());
    // The target's own greedy output: a fresh target-only Generate over
    // the history (on a stack that is up), and the in-process model's.
    v1::GenerateRequest fresh_request = IdsRequest(history, kNew);
    fresh_request.set_disable_speculation(true);
    const Generated fresh = Generate(stub_.get(), fresh_request);
    ASSERT_TRUE(fresh.status.ok()) << fresh.status.error_message();
    EXPECT_EQ(g.tokens, fresh.tokens);
    EXPECT_EQ(g.tokens, Greedy(history, kNew));
    EXPECT_EQ(g.last.usage().cache_lost(), turn == 3);
    if (turn == 4) {
      // Cached again on its new stack.
      EXPECT_GT(g.last.usage().cached_prompt_tokens(), 0);
    }
    history.insert(history.end(), g.tokens.begin(), g.tokens.end());
  }
  EXPECT_EQ(Metric("dedit_session_reprefills_total"), 1);
  EXPECT_TRUE(session.Close().ok());
  for (int i = 0; i < cluster_->num_stacks(); ++i) {
    if (i != holder) ExpectEmpty(i);
  }
}

}  // namespace
}  // namespace dedit
