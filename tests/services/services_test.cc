// The disaggregated system end to end: real dedit-target, dedit-drafter and
// dedit-router processes on loopback.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/generate_command.h"
#include "common/model/in_process.h"
#include "common/model/tiny_model.h"
#include "common/serving/round_stream.h"
#include "dedit/v1/services.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"
#include "tests/services/service_cluster.h"
#include "tests/services/stream_client.h"

namespace dedit {
namespace {

using testing::ConcurrentStreams;
using testing::Generate;
using testing::Generated;
using ::testing::HasSubstr;
using testing::IdsRequest;
using testing::RandomPrompt;
using testing::ServiceCluster;
using testing::ServiceProcess;
using testing::WaitFor;

// Target-only greedy tokens and the in-process engine's tokens for (W, K).
class Reference {
 public:
  explicit Reference(const ServiceCluster& cluster) {
    InProcessStack::Options o;
    o.target_dir = cluster.target_dir();
    o.drafter_dir = cluster.drafter_dir();
    auto stack = InProcessStack::Load(o);
    EXPECT_TRUE(stack.ok()) << stack.status();
    stack_ = std::move(*stack);
  }
  std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int n) {
    return testing::GreedyReference(stack_->target(), prompt, n);
  }
  std::vector<int32_t> InProcess(const std::vector<int32_t>& prompt, int n,
                                 int window, int passes) {
    return InProcessResult(prompt, n, window, passes).tokens;
  }
  GenerationResult InProcessResult(const std::vector<int32_t>& prompt, int n,
                                   int window, int passes) {
    GenerationRequest r;
    r.prompt = prompt;
    r.max_new_tokens = n;
    r.window = window;
    r.passes = passes;
    r.ignore_eos = true;
    auto results = stack_->engine().Generate({r});
    EXPECT_TRUE(results.ok()) << results.status();
    return results.ok() ? (*results)[0] : GenerationResult();
  }

 private:
  std::unique_ptr<InProcessStack> stack_;
};

class ServicesTest : public ::testing::Test {
 protected:
  ServicesTest() = default;
  explicit ServicesTest(ServiceCluster::Options options)
      : cluster_(std::move(options)) {}
  void SetUp() override {
    const absl::Status started = cluster_.Start();
    ASSERT_TRUE(started.ok()) << started;
    stub_ = v1::Generation::NewStub(cluster_.RouterChannel());
    ASSERT_TRUE(testing::WaitForRouterReady(stub_.get(),
                                            /*with_drafter=*/false, 20000));
  }
  std::string RouterMetrics() {
    auto text = ServiceCluster::Scrape(cluster_.router()->metrics_port());
    EXPECT_TRUE(text.ok()) << text.status();
    return text.value_or("");
  }
  v1::TargetInfoResponse TargetInfo() {
    auto stub = v1::Target::NewStub(cluster_.TargetChannel());
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::TargetInfoResponse info;
    EXPECT_TRUE(stub->Info(&c, {}, &info).ok());
    return info;
  }
  v1::DrafterInfoResponse DrafterInfo() {
    auto stub = v1::Drafter::NewStub(cluster_.DrafterChannel());
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::DrafterInfoResponse info;
    EXPECT_TRUE(stub->Info(&c, {}, &info).ok());
    return info;
  }
  // T = 0 through the services, several W/K and target-only: the in-process
  // engine's tokens, which are the target's greedy tokens.
  void ExpectMatchesInProcessEngine();
  // With the model known: the loop has reached the target too.
  bool RouterSeesDrafter() {
    return testing::RouterReady(stub_.get(), /*with_drafter=*/true);
  }

  ServiceCluster cluster_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

// T = 0: the services produce the in-process engine's tokens, which are the
// target's greedy tokens, for several W/K (and target-only).
TEST_F(ServicesTest, MatchesInProcessEngineAndGreedyDecoding) {
  ExpectMatchesInProcessEngine();
  // The router's rounds went on one stream to each model service
  // (common/serving/round_stream.h).
  EXPECT_EQ(TargetInfo().round_streams(), 1);
  EXPECT_EQ(DrafterInfo().round_streams(), 1);
  const std::string metrics = RouterMetrics();
  EXPECT_EQ(
      ServiceCluster::MetricValue(metrics, "dedit_round_streams_opened_total",
                                  "service=\"target\""),
      1);
  EXPECT_EQ(
      ServiceCluster::MetricValue(metrics, "dedit_round_streams_opened_total",
                                  "service=\"drafter\""),
      1);
}

// --round_streams=false: a unary Target.Step and Drafter.Draft per round,
// the same tokens.
class UnaryRoundsServicesTest : public ServicesTest {
 protected:
  UnaryRoundsServicesTest() : ServicesTest(UnaryOptions()) {}
  static ServiceCluster::Options UnaryOptions() {
    ServiceCluster::Options o;
    o.router_flags = {"--round_streams=false"};
    return o;
  }
};

TEST_F(UnaryRoundsServicesTest, MatchesInProcessEngineAndGreedyDecoding) {
  ExpectMatchesInProcessEngine();
  EXPECT_EQ(TargetInfo().round_streams(), 0);
  EXPECT_EQ(DrafterInfo().round_streams(), 0);
  EXPECT_EQ(ServiceCluster::MetricValue(RouterMetrics(),
                                        "dedit_round_streams_opened_total"),
            0);
}

void ServicesTest::ExpectMatchesInProcessEngine() {
  ASSERT_TRUE(WaitFor([&] { return RouterSeesDrafter(); }, 10000));
  Reference ref(cluster_);
  const int kNew = 24;
  const std::vector<std::pair<int, int>> configs = {{1, 0}, {2, 1},  {4, 1},
                                                    {8, 2}, {16, 3}, {32, 3}};
  int c = 0;
  for (auto [w, k] : configs) {
    const std::vector<int32_t> prompt = RandomPrompt(5 + 7 * c, 300, 100 + c);
    ++c;
    v1::GenerateRequest request = IdsRequest(prompt, kNew, w, k);
    if (w == 1) request.set_disable_speculation(true);
    Generated g = Generate(stub_.get(), request);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    const std::vector<int32_t> greedy = ref.Greedy(prompt, kNew);
    EXPECT_EQ(g.tokens, greedy) << "W=" << w << " K=" << k;
    EXPECT_EQ(g.tokens, ref.InProcess(prompt, kNew, w, std::max(k, 0)))
        << "W=" << w << " K=" << k;
    EXPECT_TRUE(g.last.finished());
    EXPECT_EQ(g.last.finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(g.last.usage().completion_tokens(), kNew);
    EXPECT_EQ(g.last.usage().prompt_tokens(), static_cast<int>(prompt.size()));
    const v1::AcceptanceStats& a = g.last.acceptance();
    EXPECT_EQ(a.fallback_rounds(), 0);
    if (w >= 2) {
      EXPECT_GT(a.drafted_rounds(), 0) << "W=" << w;
      EXPECT_GE(a.mean_acceptance_length(), 1.0);
      EXPECT_EQ(a.edit_outcomes_size(), k - 1);
    } else {
      EXPECT_EQ(a.drafted_rounds(), 0);
    }
  }
  // Text prompts and text deltas: the streamed text is the decoded tokens.
  v1::GenerateRequest text;
  text.set_text("Hello world");
  text.set_max_tokens(12);
  text.set_ignore_eos(true);
  Generated g = Generate(stub_.get(), text);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens.size(), 12u);
  EXPECT_FALSE(g.text.empty());
}

// 16 concurrent streams complete with the right tokens, and the target
// batched them (forwards with more than one sequence).
// The n-gram method runs in the router (no drafter service involved):
// through the services its output is the target's greedy output for every
// window, and text that repeats is accepted in multi-token blocks.
TEST_F(ServicesTest, NgramMethodThroughTheRouterIsLossless) {
  ASSERT_TRUE(WaitFor([&] { return RouterSeesDrafter(); }, 10000));
  Reference ref(cluster_);
  const int kNew = 24;
  int64_t accepted = 0;
  for (int w : {2, 8, 32}) {
    std::vector<int32_t> prompt = RandomPrompt(8, 300, 300 + w);
    const std::vector<int32_t> answer = ref.Greedy(prompt, kNew);
    // prompt + its answer + prompt: the answer can be looked up.
    std::vector<int32_t> repeated = prompt;
    repeated.insert(repeated.end(), answer.begin(), answer.end());
    repeated.insert(repeated.end(), prompt.begin(), prompt.end());
    v1::GenerateRequest request = IdsRequest(repeated, kNew, w, 0);
    request.set_speculative_method(v1::SPECULATIVE_METHOD_NGRAM);
    Generated g = Generate(stub_.get(), request);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.tokens, ref.Greedy(repeated, kNew)) << "W=" << w;
    const v1::AcceptanceStats& a = g.last.acceptance();
    EXPECT_EQ(a.fallback_rounds(), 0);
    EXPECT_EQ(a.edit_outcomes_size(), 0);
    accepted += a.accepted_tokens();
  }
  EXPECT_GT(accepted, 0);
  v1::GenerateRequest bad = IdsRequest({1, 2, 3}, 4, 8, 2);
  bad.set_speculative_method(v1::SPECULATIVE_METHOD_NGRAM);
  Generated g = Generate(stub_.get(), bad);
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(g.status.error_message(), HasSubstr("n-gram"));
}

// The hybrid method across the services: lookup rounds in the router and
// drafter-service rounds in one request, lossless for every W and K.
TEST_F(ServicesTest, HybridMethodThroughTheRouterIsLossless) {
  ASSERT_TRUE(WaitFor([&] { return RouterSeesDrafter(); }, 10000));
  Reference ref(cluster_);
  const int kNew = 24;
  int64_t lookups = 0, model_rounds = 0;
  for (int w : {4, 16}) {
    for (int k : {1, 2}) {
      std::vector<int32_t> prompt = RandomPrompt(8, 300, 400 + w + k);
      const std::vector<int32_t> answer = ref.Greedy(prompt, kNew / 2);
      // The first half of the answer can be looked up, the rest not.
      std::vector<int32_t> repeated = prompt;
      repeated.insert(repeated.end(), answer.begin(), answer.end());
      repeated.insert(repeated.end(), prompt.begin(), prompt.end());
      v1::GenerateRequest request = IdsRequest(repeated, kNew, w, k);
      request.set_speculative_method(v1::SPECULATIVE_METHOD_HYBRID);
      Generated g = Generate(stub_.get(), request);
      ASSERT_TRUE(g.status.ok()) << g.status.error_message();
      EXPECT_EQ(g.tokens, ref.Greedy(repeated, kNew)) << "W=" << w;
      const v1::AcceptanceStats& a = g.last.acceptance();
      EXPECT_EQ(a.fallback_rounds(), 0);
      lookups += a.lookup_rounds();
      model_rounds += a.drafted_rounds() - a.lookup_rounds();
    }
  }
  EXPECT_GT(lookups, 0);
  EXPECT_GT(model_rounds, 0);
}

// A lookup-seeded drafter behind the router: the drafter service says so
// in Info, the router sends each round's lookup seed with the draft
// (DraftItem.seed), and the rounds are the in-process engine's: the same
// edit outcomes (P1's proposals depend on the seeds) and the target's
// greedy tokens. A seed longer than W-1 is refused by the drafter service.
class SeededServicesTest : public ServicesTest {
 protected:
  SeededServicesTest() : ServicesTest(SeededOptions()) {}
  static ServiceCluster::Options SeededOptions() {
    ServiceCluster::Options o;
    o.drafter_lookup_seed_ngram = 1;
    return o;
  }
};

TEST_F(SeededServicesTest, SeedsTravelAndRoundsMatchInProcess) {
  ASSERT_TRUE(WaitFor([&] { return RouterSeesDrafter(); }, 10000));
  EXPECT_EQ(DrafterInfo().lookup_seed_ngram(), 1);
  Reference ref(cluster_);
  const int kNew = 24;
  for (int w : {4, 16}) {
    std::vector<int32_t> prompt = RandomPrompt(8, 300, 500 + w);
    const std::vector<int32_t> answer = ref.Greedy(prompt, kNew / 2);
    std::vector<int32_t> repeated = prompt;
    repeated.insert(repeated.end(), answer.begin(), answer.end());
    repeated.insert(repeated.end(), prompt.begin(), prompt.end());
    Generated g = Generate(stub_.get(), IdsRequest(repeated, kNew, w, 2));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.tokens, ref.Greedy(repeated, kNew)) << "W=" << w;
    const GenerationResult local = ref.InProcessResult(repeated, kNew, w, 2);
    EXPECT_EQ(g.tokens, local.tokens);
    const AcceptanceSummary want = Summarize(local.rounds);
    const v1::AcceptanceStats& a = g.last.acceptance();
    EXPECT_EQ(a.rounds(), want.rounds) << "W=" << w;
    EXPECT_EQ(a.accepted_tokens(), want.accepted_tokens) << "W=" << w;
    ASSERT_EQ(a.edit_outcomes_size(), 1);
    ASSERT_EQ(want.edit_outcomes.size(), 1u);
    EXPECT_EQ(a.edit_outcomes(0).extended(), want.edit_outcomes[0][0]);
    EXPECT_EQ(a.edit_outcomes(0).unchanged(), want.edit_outcomes[0][1]);
    EXPECT_EQ(a.edit_outcomes(0).shortened(), want.edit_outcomes[0][2]);
  }
  // Straight to the drafter service: a seed of W tokens fails its item.
  auto drafter = v1::Drafter::NewStub(cluster_.DrafterChannel());
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::DraftRequest request;
  v1::DraftItem* item = request.add_items();
  item->set_sequence(77);
  item->set_window(4);
  item->set_passes(1);
  for (int t : {1, 2, 3, 4}) item->add_seed(t);
  v1::DraftResponse response;
  ASSERT_TRUE(drafter->Draft(&c, request, &response).ok());
  ASSERT_EQ(response.results_size(), 1);
  EXPECT_EQ(response.results(0).code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(response.results(0).message(), HasSubstr("seed"));
}

TEST_F(ServicesTest, SixteenConcurrentStreams) {
  ASSERT_TRUE(WaitFor([&] { return RouterSeesDrafter(); }, 10000));
  Reference ref(cluster_);
  const int kStreams = 16, kNew = 20;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kStreams; ++i) {
    prompts.push_back(RandomPrompt(4 + i, 300, 1000 + i));
  }
  std::vector<Generated> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      results[i] = Generate(stub_.get(), IdsRequest(prompts[i], kNew, 8, 2));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, ref.Greedy(prompts[i], kNew))
        << "stream " << i;
  }
  auto text = ServiceCluster::Scrape(cluster_.target()->metrics_port());
  ASSERT_TRUE(text.ok()) << text.status();
  const double forwards =
      ServiceCluster::MetricValue(*text, "dedit_target_batch_size_count");
  const double single = ServiceCluster::MetricValue(
      *text, "dedit_target_batch_size_bucket", "le=\"1\"");
  EXPECT_GT(forwards, 0);
  EXPECT_GT(forwards - single, 0) << "no forward held more than one sequence";
  const std::string router = RouterMetrics();
  EXPECT_EQ(ServiceCluster::MetricValue(router, "dedit_requests_total",
                                        "status=\"ok\""),
            kStreams);
  EXPECT_EQ(
      ServiceCluster::MetricValue(router, "dedit_generation_tokens_total"),
      kStreams * kNew);
}

// Killing the drafter mid-stream costs speed, never a request; a restarted
// drafter serves new requests again.
TEST_F(ServicesTest, DrafterKilledMidStreamThenRestarted) {
  ASSERT_TRUE(WaitFor([&] { return RouterSeesDrafter(); }, 10000));
  Reference ref(cluster_);
  const int kStreams = 4, kNew = 160;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kStreams; ++i)
    prompts.push_back(RandomPrompt(6, 300, 50 + i));
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < kStreams; ++i) {
    requests.push_back(IdsRequest(prompts[i], kNew, 8, 2));
  }
  ConcurrentStreams streams(stub_.get(), requests);
  std::vector<Generated>& results = streams.results;
  const bool all_started =
      WaitFor([&] { return streams.started.load() == kStreams; }, 30000);
  cluster_.KillDrafter();
  streams.Join();
  ASSERT_TRUE(all_started) << "the streams did not start";
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens, ref.Greedy(prompts[i], kNew))
        << "stream " << i;
  }
  EXPECT_GT(ServiceCluster::MetricValue(RouterMetrics(),
                                        "dedit_fallback_rounds_total"),
            0);
  // While it is down, new requests are served target-only.
  Generated during = Generate(stub_.get(), IdsRequest(prompts[0], 8, 8, 2));
  ASSERT_TRUE(during.status.ok()) << during.status.error_message();
  EXPECT_EQ(during.last.acceptance().drafted_rounds(), 0);

  ASSERT_TRUE(cluster_.RestartDrafter().ok());
  ASSERT_TRUE(WaitFor([&] { return RouterSeesDrafter(); }, 15000));
  Generated after = Generate(stub_.get(), IdsRequest(prompts[1], 24, 8, 2));
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens, ref.Greedy(prompts[1], 24));
  EXPECT_GT(after.last.acceptance().drafted_rounds(), 0);
  EXPECT_EQ(after.last.acceptance().fallback_rounds(), 0);
  // The router's Draft calls reach the new drafter on a new round stream.
  EXPECT_EQ(DrafterInfo().round_streams(), 1);
  EXPECT_GE(ServiceCluster::MetricValue(RouterMetrics(),
                                        "dedit_round_streams_opened_total",
                                        "service=\"drafter\""),
            2);
}

grpc::health::v1::HealthCheckResponse::ServingStatus Health(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& name) {
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(name);
  grpc::health::v1::HealthCheckResponse response;
  if (!health->Check(&c, request, &response).ok()) {
    return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  }
  return response.status();
}

// Once a model service has written its ready file, its warm-up forward has
// run (and left nothing behind) and its health is SERVING, overall and
// named (the drafter's name also needs the target's context stream).
TEST_F(ServicesTest, ModelServicesServeOnlyWarmedUp) {
  constexpr auto kServing = grpc::health::v1::HealthCheckResponse::SERVING;
  EXPECT_EQ(Health(cluster_.TargetChannel(), ""), kServing);
  EXPECT_EQ(Health(cluster_.TargetChannel(), "dedit.v1.Target"), kServing);
  EXPECT_EQ(Health(cluster_.DrafterChannel(), ""), kServing);
  // The router is ready once a stack takes requests.
  EXPECT_TRUE(WaitFor(
      [&] {
        return Health(cluster_.RouterChannel(), "dedit.v1.Generation") ==
               kServing;
      },
      10000));
  EXPECT_TRUE(WaitFor(
      [&] {
        return Health(cluster_.DrafterChannel(), "dedit.v1.Drafter") ==
               kServing;
      },
      10000));
  const v1::TargetInfoResponse target = TargetInfo();
  EXPECT_EQ(target.num_sequences(), 0);
  EXPECT_EQ(target.cached_tokens(), 0);
  EXPECT_EQ(target.reserved_tokens(), 0);
  const v1::DrafterInfoResponse drafter = DrafterInfo();
  EXPECT_EQ(drafter.num_sequences(), 0);
  EXPECT_EQ(drafter.context_tokens(), 0);
}

// A router that waits 1.5 s for a failed stream's stack to come back
// (--resume_wait_ms; the default is 60 s, or the request's deadline).
class ShortResumeServicesTest : public ServicesTest {
 protected:
  ShortResumeServicesTest() : ServicesTest(ShortResumeOptions()) {}
  static ServiceCluster::Options ShortResumeOptions() {
    ServiceCluster::Options o;
    o.router_flags = {"--resume_wait_ms=1500"};
    return o;
  }
};

// The target going away for good: the running stream waits
// --resume_wait_ms for a stack to continue it on, then ends UNAVAILABLE;
// a new request is refused at once; the router itself keeps answering
// health checks and /metrics.
TEST_F(ShortResumeServicesTest, TargetKilledClientsGetUnavailable) {
  std::atomic<bool> got_tokens{false};
  Generated running;
  std::thread t([&] {
    running =
        Generate(stub_.get(), IdsRequest(RandomPrompt(6, 300, 9), 3000, 8, 2),
                 120, [&](const Generated& g) {
                   if (!g.tokens.empty()) got_tokens = true;
                 });
  });
  if (!WaitFor([&] { return got_tokens.load(); }, 30000)) {
    cluster_.KillTarget();
    t.join();
    FAIL() << "no tokens: " << running.status.error_message();
  }
  const auto killed = std::chrono::steady_clock::now();
  cluster_.KillTarget();
  t.join();
  EXPECT_EQ(running.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << running.status.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - killed, std::chrono::seconds(5));

  const auto t0 = std::chrono::steady_clock::now();
  Generated fresh = Generate(stub_.get(), IdsRequest({1, 2, 3}, 8));
  EXPECT_EQ(fresh.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));

  // Live ("") but not ready: dedit.v1.Generation is NOT_SERVING while no
  // stack takes requests, so Kubernetes stops routing clients here.
  EXPECT_EQ(Health(cluster_.RouterChannel(), ""),
            grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_TRUE(WaitFor(
      [&] {
        return Health(cluster_.RouterChannel(), "dedit.v1.Generation") ==
               grpc::health::v1::HealthCheckResponse::NOT_SERVING;
      },
      5000));
  const std::string metrics = RouterMetrics();
  EXPECT_GE(ServiceCluster::MetricValue(metrics, "dedit_requests_total",
                                        "status=\"unavailable\""),
            2);
  EXPECT_TRUE(
      WaitFor([&] { return DrafterInfo().num_sequences() == 0; }, 5000));
}

// When the router died too (nobody releases anything), the
// drafter drops the contexts the dead target's stream fed: no release
// marker will ever come for them.
TEST_F(ServicesTest, TargetKilledAfterItsRouterDrafterDropsTheContexts) {
  ASSERT_TRUE(WaitFor([&] { return RouterSeesDrafter(); }, 10000));
  const int kStreams = 4;
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < kStreams; ++i) {
    requests.push_back(IdsRequest(RandomPrompt(6, 300, 90 + i), 4096, 8, 1));
  }
  ConcurrentStreams streams(stub_.get(), requests);
  ASSERT_TRUE(WaitFor([&] { return streams.started == kStreams; }, 30000));
  cluster_.router()->Kill();
  streams.Join();
  // The target's default lease (60 s) keeps them meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(DrafterInfo().num_sequences(), kStreams);
  cluster_.KillTarget();
  EXPECT_TRUE(
      WaitFor([&] { return DrafterInfo().num_sequences() == 0; }, 5000));
  EXPECT_EQ(DrafterInfo().context_tokens(), 0);
  auto metrics = ServiceCluster::Scrape(cluster_.drafter()->metrics_port());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(ServiceCluster::MetricValue(
                *metrics, "dedit_drafter_contexts_orphaned_total"),
            kStreams);
  EXPECT_EQ(ServiceCluster::MetricValue(*metrics, "dedit_drafter_sequences"),
            0);
}

// SIGTERM to the model services while the router holds a round stream to
// each: the idle streams end at once (UNAVAILABLE, "draining"), so neither
// service waits out its 30 s drain timeout, and the router fails the next
// request UNAVAILABLE.
class LongDrainServicesTest : public ServicesTest {
 protected:
  LongDrainServicesTest() : ServicesTest(LongDrainOptions()) {}
  static ServiceCluster::Options LongDrainOptions() {
    ServiceCluster::Options o;
    o.target_flags = {"--drain_timeout_ms=30000"};
    o.drafter_flags = {"--drain_timeout_ms=30000"};
    return o;
  }
};

TEST_F(LongDrainServicesTest, ModelServicesDrainWithOpenRoundStreams) {
  ASSERT_TRUE(WaitFor([&] { return RouterSeesDrafter(); }, 10000));
  Generated g =
      Generate(stub_.get(), IdsRequest(RandomPrompt(5, 300, 12), 16, 8, 1));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  ASSERT_EQ(TargetInfo().round_streams(), 1);
  ASSERT_EQ(DrafterInfo().round_streams(), 1);
  for (ServiceProcess* service : {cluster_.drafter(), cluster_.target()}) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(service->Terminate(60000), 0);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
  }
  Generated after = Generate(stub_.get(), IdsRequest({1, 2, 3}, 8));
  EXPECT_EQ(after.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << after.status.error_message();
}

// A client that cancels mid-stream leaves nothing behind in either service.
TEST_F(ServicesTest, ClientCancelReleasesBothServices) {
  ASSERT_TRUE(WaitFor([&] { return RouterSeesDrafter(); }, 10000));
  grpc::ClientContext context;
  auto reader = stub_->Generate(
      &context, IdsRequest(RandomPrompt(8, 300, 3), 3000, 8, 2));
  v1::GenerateResponse response;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(TargetInfo().num_sequences(), 1);
  EXPECT_EQ(DrafterInfo().num_sequences(), 1);
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitFor([&] { return TargetInfo().num_sequences() == 0; }, 5000));
  EXPECT_TRUE(
      WaitFor([&] { return DrafterInfo().num_sequences() == 0; }, 5000));
  EXPECT_EQ(TargetInfo().reserved_tokens(), 0);
  EXPECT_TRUE(WaitFor(
      [&] {
        return ServiceCluster::MetricValue(RouterMetrics(),
                                           "dedit_requests_running") == 0;
      },
      5000));
}

// A router killed mid-stream never releases its
// sequences; their leases run out on the target, which frees the KV and
// tells the drafter, and a new router serves as before.
TEST(ServicesLeaseTest, RouterKilledMidStreamSequencesExpireOnBothServices) {
  ServiceCluster::Options options;
  options.target_flags = {"--sequence_lease_seconds=1"};
  ServiceCluster cluster(options);
  const absl::Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started;
  auto stub = v1::Generation::NewStub(cluster.RouterChannel());
  ASSERT_TRUE(
      testing::WaitForRouterReady(stub.get(), /*with_drafter=*/true, 20000));
  auto target = v1::Target::NewStub(cluster.TargetChannel());
  auto drafter = v1::Drafter::NewStub(cluster.DrafterChannel());
  auto target_info = [&] {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::TargetInfoResponse info;
    EXPECT_TRUE(target->Info(&c, {}, &info).ok());
    return info;
  };
  auto drafter_sequences = [&] {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::DrafterInfoResponse info;
    EXPECT_TRUE(drafter->Info(&c, {}, &info).ok());
    return info.num_sequences();
  };
  EXPECT_DOUBLE_EQ(target_info().sequence_lease_seconds(), 1.0);

  // Long requests (the tiny model's whole context, speculative), so that
  // every stream is still running when the router dies.
  const int kStreams = 6;
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < kStreams; ++i) {
    requests.push_back(IdsRequest(RandomPrompt(6, 300, 70 + i), 4096, 8, 1));
  }
  ConcurrentStreams streams(stub.get(), requests);
  ASSERT_TRUE(WaitFor([&] { return streams.started == kStreams; }, 30000));
  // Normally all of them; on a loaded machine the first streams can reach
  // the context limit before the last one starts, and those sequences were
  // released as usual. Each one still running is left behind by the kill.
  const int running = target_info().num_sequences();
  ASSERT_GE(running, 1);
  cluster.router()->Kill();
  streams.Join();
  const auto killed = std::chrono::steady_clock::now();

  // Gone within the lease (1 s) plus the expiry check's slack (a quarter
  // of the lease) and the release's trip to the drafter.
  EXPECT_TRUE(
      WaitFor([&] { return target_info().num_sequences() == 0; }, 10000));
  EXPECT_TRUE(WaitFor([&] { return drafter_sequences() == 0; }, 5000));
  EXPECT_LT(std::chrono::steady_clock::now() - killed, std::chrono::seconds(5));
  const v1::TargetInfoResponse after = target_info();
  EXPECT_EQ(after.reserved_tokens(), 0);
  EXPECT_EQ(after.cached_tokens(), 0);
  EXPECT_EQ(after.expired_sequences(), running);
  auto metrics = ServiceCluster::Scrape(cluster.target()->metrics_port());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(ServiceCluster::MetricValue(*metrics,
                                        "dedit_target_sequences_expired_total"),
            running);
  EXPECT_EQ(ServiceCluster::MetricValue(*metrics, "dedit_target_sequences"), 0);

  // KeepAlive answers which sequences no longer exist.
  {
    grpc::ClientContext c;
    v1::KeepAliveRequest request;
    request.add_sequences(12345);
    v1::KeepAliveResponse response;
    ASSERT_TRUE(target->KeepAlive(&c, request, &response).ok());
    ASSERT_EQ(response.missing_size(), 1);
    EXPECT_EQ(response.missing(0), 12345u);
  }
}

// A cluster with its own flags (target-only), serving once the router has
// learned the model.
std::unique_ptr<ServiceCluster> StartLimitsCluster(
    std::vector<std::string> target_flags,
    std::vector<std::string> router_flags = {}) {
  ServiceCluster::Options options;
  options.with_drafter = false;
  options.target_flags = std::move(target_flags);
  options.router_flags = std::move(router_flags);
  auto cluster = std::make_unique<ServiceCluster>(options);
  const absl::Status started = cluster->Start();
  EXPECT_TRUE(started.ok()) << started;
  if (!started.ok()) return nullptr;
  auto stub = v1::Generation::NewStub(cluster->RouterChannel());
  const bool ready =
      testing::WaitForRouterReady(stub.get(), /*with_drafter=*/false, 20000);
  EXPECT_TRUE(ready);
  return ready ? std::move(cluster) : nullptr;
}

// A large max_tokens reserves at most the max context,
// so a KV capacity of 4 contexts runs 4 such requests at once (it used to
// reserve prompt + max_tokens + W, ~2 contexts each, and refuse two).
TEST(ServicesLimitsTest, LargeMaxTokensReservesAtMostTheContext) {
  const int64_t kContext = DefaultTinySpec().target.max_position_embeddings;
  auto cluster =
      StartLimitsCluster({absl::StrCat("--kv_capacity_tokens=", 4 * kContext)});
  ASSERT_NE(cluster, nullptr);
  auto stub = v1::Generation::NewStub(cluster->RouterChannel());
  auto target = v1::Target::NewStub(cluster->TargetChannel());
  const int kStreams = 4;
  std::vector<Generated> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      results[i] = Generate(
          stub.get(), IdsRequest(RandomPrompt(5, 300, 50 + i), 4096), 120);
    });
  }
  int64_t most_reserved = 0;
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < until) {
    grpc::ClientContext c;
    v1::TargetInfoResponse info;
    if (target->Info(&c, {}, &info).ok()) {
      most_reserved = std::max(most_reserved, info.reserved_tokens());
      if (info.num_sequences() == 0 && most_reserved > 0) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(results[i].status.ok())
        << "stream " << i << ": " << results[i].status.error_message();
    // Each runs to the context limit, far past a few rounds.
    EXPECT_GT(static_cast<int64_t>(results[i].tokens.size()), kContext / 2)
        << "stream " << i;
  }
  EXPECT_LE(most_reserved, 4 * kContext);
  EXPECT_GT(most_reserved, 0);
}

// A "Vm...:" field of /proc/PID/status in kB (0 when absent).
int64_t ProcStatusKb(pid_t pid, const std::string& field) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field, 0) == 0) {
      return std::strtoll(line.c_str() + field.size(), nullptr, 10);
    }
  }
  return 0;
}

// The target's port takes messages up to
// --max_receive_bytes (a router keeps its rounds under it with
// --max_prefill_tokens_per_round), not 1 GiB; a larger one is refused
// unread, as a unary Step or on a round stream, and the target serves on.
TEST(ServicesLimitsTest, TargetRefusesMessagesOverItsReceiveLimit) {
  auto cluster = StartLimitsCluster({"--max_receive_bytes=1048576"});
  ASSERT_NE(cluster, nullptr);
  auto target = v1::Target::NewStub(cluster->TargetChannel());
  v1::StepRequest huge;
  v1::PrefillItem* item = huge.mutable_prefill()->add_items();
  item->set_sequence(1);
  for (int i = 0; i < 400000; ++i) item->add_prompt(200 + i % 100);  // 800 KB
  v1::PrefillItem* second = huge.mutable_prefill()->add_items();
  *second = *item;
  second->set_sequence(2);  // 1.6 MB in all
  grpc::ClientContext c;
  v1::StepResponse response;
  const grpc::Status status = target->Step(&c, huge, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << status.error_message();
  // The same round on a Target.Rounds stream ends that stream, also
  // RESOURCE_EXHAUSTED; the next round on a new stream is answered.
  RoundStreamClient<v1::StepRequest, v1::StepResponse> rounds(
      [&target](grpc::ClientContext* c, grpc::CompletionQueue* cq) {
        return target->PrepareAsyncRounds(c, cq);
      });
  const auto in_10s = [] {
    return std::chrono::system_clock::now() + std::chrono::seconds(10);
  };
  const absl::Status streamed = rounds.Call(huge, &response, in_10s());
  EXPECT_EQ(streamed.code(), absl::StatusCode::kResourceExhausted) << streamed;
  v1::StepRequest empty;
  response.Clear();
  const absl::Status next = rounds.Call(empty, &response, in_10s());
  EXPECT_TRUE(next.ok()) << next;
  EXPECT_EQ(response.code(), 0);
  // Nothing was admitted, and requests through the router still work.
  grpc::ClientContext ic;
  v1::TargetInfoResponse info;
  ASSERT_TRUE(target->Info(&ic, {}, &info).ok());
  EXPECT_EQ(info.num_sequences(), 0);
  auto stub = v1::Generation::NewStub(cluster->RouterChannel());
  Generated g = Generate(stub.get(), IdsRequest(RandomPrompt(6, 300, 5), 8));
  EXPECT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens.size(), 8u);
}

// The public port takes messages up to
// --max_request_bytes, and text that cannot fit the context is refused
// before it is tokenized; both fast.
TEST(ServicesLimitsTest, OversizedPromptsAreRefusedFast) {
  auto cluster = StartLimitsCluster({}, {"--max_request_bytes=2097152"});
  ASSERT_NE(cluster, nullptr);
  auto stub = v1::Generation::NewStub(cluster->RouterChannel());
  v1::GenerateRequest huge;
  huge.set_text(std::string(3 << 20, 'a'));
  huge.set_max_tokens(8);
  Generated g = Generate(stub.get(), huge, 10);
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << g.status.error_message();
  EXPECT_THAT(g.status.error_message(), HasSubstr("2097152"));

  // gRPC would buffer all of an oversized message before refusing it; the
  // public port's memory quota (--max_receive_memory_bytes, default 32 MiB)
  // keeps a 128 MB one from growing the router by more than the quota.
  const int64_t peak_before_kb =
      ProcStatusKb(cluster->router()->pid(), "VmHWM:");
  huge.set_text(std::string(128 << 20, 'a'));
  g = Generate(stub.get(), huge, 30);
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << g.status.error_message();
  const int64_t peak_growth_mb =
      (ProcStatusKb(cluster->router()->pid(), "VmHWM:") - peak_before_kb) /
      1024;
  EXPECT_LT(peak_growth_mb, 48) << "router peak RSS grew by that much";

  v1::GenerateRequest long_text;
  long_text.set_text(std::string(1 << 20, 'a'));
  long_text.set_max_tokens(8);
  const auto start = std::chrono::steady_clock::now();
  g = Generate(stub.get(), long_text, 10);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << g.status.error_message();
  EXPECT_THAT(g.status.error_message(), HasSubstr("--max_bytes_per_token"));
  EXPECT_LT(seconds, 1.0);
  // Chat content counts the same.
  v1::GenerateRequest chat;
  auto* m = chat.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content(std::string(1 << 20, 'b'));
  chat.set_max_tokens(8);
  g = Generate(stub.get(), chat, 10);
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(g.status.error_message(), HasSubstr("chat.messages content"));
  v1::GenerateRequest ok;
  ok.set_text("Once upon a time");
  ok.set_max_tokens(4);
  g = Generate(stub.get(), ok, 30);
  EXPECT_TRUE(g.status.ok()) << g.status.error_message();
}

// The drafter refuses a context chunk that would pass
// the model's positions, before copying its rows; the real stream is kept.
TEST_F(ServicesTest, DrafterRefusesContextPastTheMaxPositions) {
  ASSERT_TRUE(WaitFor([&] { return RouterSeesDrafter(); }, 10000));
  const v1::DrafterInfoResponse info = DrafterInfo();
  auto drafter = v1::Drafter::NewStub(cluster_.DrafterChannel());
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StreamContextSummary summary;
  auto writer = drafter->StreamContext(&c, &summary);
  v1::ContextChunk chunk;
  chunk.set_sequence(777);
  chunk.set_start(0);
  chunk.mutable_features()->set_dtype("bfloat16");
  chunk.mutable_features()->add_shape(
      cluster_.spec().target.max_position_embeddings + 1);
  chunk.mutable_features()->add_shape(info.feature_width());
  writer->Write(chunk);
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::OUT_OF_RANGE)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("max context"));
  // A message larger than a whole context's chunk (float32, plus 1 MiB)
  // is refused before it is read.
  const int64_t limit = cluster_.spec().target.max_position_embeddings *
                            int64_t{info.feature_width()} * 4 +
                        (int64_t{1} << 20);
  grpc::ClientContext big_context;
  big_context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(10));
  auto big = drafter->StreamContext(&big_context, &summary);
  chunk.mutable_features()->set_data(std::string(limit + 1, '\0'));
  big->Write(chunk);
  big->WritesDone();
  const grpc::Status too_big = big->Finish();
  EXPECT_EQ(too_big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << too_big.error_message();
  // The target's stream still serves speculation.
  Generated ok = Generate(stub_.get(), IdsRequest({1, 2, 3}, 8, 8, 2));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_TRUE(RouterSeesDrafter());
}

// Each malformed request is INVALID_ARGUMENT naming the problem; the
// servers keep serving.
TEST_F(ServicesTest, BadRequestsAreInvalidArgument) {
  ASSERT_TRUE(WaitFor([&] { return RouterSeesDrafter(); }, 10000));
  struct Case {
    std::string name;
    v1::GenerateRequest request;
    std::string message;
  };
  std::vector<Case> cases;
  auto add = [&](std::string name, std::string message,
                 std::function<void(v1::GenerateRequest*)> edit) {
    v1::GenerateRequest r = IdsRequest({1, 2, 3}, 8);
    edit(&r);
    cases.push_back({std::move(name), std::move(r), std::move(message)});
  };
  add("empty ids", "prompt is empty",
      [](auto* r) { r->mutable_token_ids()->clear_ids(); });
  add("empty text", "prompt text is empty", [](auto* r) { r->set_text(""); });
  add("no prompt", "prompt is required", [](auto* r) { r->clear_prompt(); });
  add("id out of vocabulary", "outside the vocabulary",
      [](auto* r) { r->mutable_token_ids()->add_ids(320); });
  add("negative id", "outside the vocabulary",
      [](auto* r) { r->mutable_token_ids()->add_ids(-1); });
  add("max_tokens 0", "max_tokens", [](auto* r) { r->set_max_tokens(0); });
  add("max_tokens negative", "max_tokens",
      [](auto* r) { r->set_max_tokens(-5); });
  add("max_tokens over limit", "max_tokens",
      [](auto* r) { r->set_max_tokens(1000000); });
  add("W over block size", "block size", [](auto* r) { r->set_window(33); });
  add("K < 1", "passes", [](auto* r) { r->set_passes(-1); });
  add("K too large", "passes", [](auto* r) { r->set_passes(99); });
  add("unknown model", "unknown model",
      [](auto* r) { r->set_model("gpt-17"); });
  add("prompt over context", "context limit", [](auto* r) {
    r->mutable_token_ids()->clear_ids();
    for (int i = 0; i < 2048; ++i) r->mutable_token_ids()->add_ids(i % 300);
  });
  add("bad chat role", "role 'wizard'", [](auto* r) {
    auto* m = r->mutable_chat()->add_messages();
    m->set_role("wizard");
    m->set_content("hi");
  });
  add("empty chat", "no messages", [](auto* r) { r->mutable_chat(); });
  add("negative temperature", "temperature",
      [](auto* r) { r->mutable_sampling()->set_temperature(-1); });
  add("top_p above 1", "top_p",
      [](auto* r) { r->mutable_sampling()->set_top_p(2); });
  add("empty stop string", "stop[0]", [](auto* r) { r->add_stop(""); });
  for (const Case& c : cases) {
    Generated g = Generate(stub_.get(), c.request, 10);
    EXPECT_EQ(g.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name << ": " << g.status.error_message();
    EXPECT_THAT(g.status.error_message(), HasSubstr(c.message)) << c.name;
    EXPECT_TRUE(g.tokens.empty()) << c.name;
  }
  Generated ok = Generate(stub_.get(), IdsRequest({1, 2, 3}, 8));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens.size(), 8u);
  EXPECT_GE(ServiceCluster::MetricValue(RouterMetrics(), "dedit_requests_total",
                                        "status=\"invalid_argument\""),
            static_cast<double>(cases.size()));
}

// Stop strings cut the text (and end the request) where they appear.
TEST_F(ServicesTest, StopStringEndsTheRequest) {
  v1::GenerateRequest probe;
  probe.set_text("Once upon a time");
  probe.set_max_tokens(40);
  probe.set_ignore_eos(true);
  Generated full = Generate(stub_.get(), probe);
  ASSERT_TRUE(full.status.ok()) << full.status.error_message();
  ASSERT_GT(full.text.size(), 8u);
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  probe.add_stop(stop);
  Generated cut = Generate(stub_.get(), probe);
  ASSERT_TRUE(cut.status.ok()) << cut.status.error_message();
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(cut.last.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(cut.last.stop_reason(), stop);
}

// The API is usable outside C++: Debian's python3-grpcio with stubs
// generated from our protos streams a generation.
TEST_F(ServicesTest, PythonClientStreamsAGeneration) {
  const std::string command = absl::StrCat(
      "/usr/bin/python3 ", DEDIT_SOURCE_DIR,
      "/tests/services/python_client_test.py --router ",
      cluster_.router_address(), " --stubs ", DEDIT_PROTO_PYTHON_DIR, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int status = pclose(pipe);
  EXPECT_EQ(status, 0) << output;
  EXPECT_THAT(output, HasSubstr("python client OK"));
  EXPECT_THAT(output, HasSubstr("python session OK"));
}

// `dedit-cli generate` (router/client): text on one stream, one stats line
// on the other.
TEST_F(ServicesTest, CliGenerateStreamsTextThenStats) {
  GenerateCommandOptions o;
  o.router = cluster_.router_address();
  o.prompt = "Hello there";
  o.max_tokens = 10;
  o.ignore_eos = true;
  std::ostringstream text, stats;
  const absl::Status status = RunGenerate(o, text, stats);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_GT(text.str().size(), 1u);
  EXPECT_THAT(stats.str(), HasSubstr("10 tokens"));
  EXPECT_THAT(stats.str(), HasSubstr("mean acceptance length"));
  o.max_tokens = 0;
  EXPECT_EQ(RunGenerate(o, text, stats).code(),
            absl::StatusCode::kInvalidArgument);
}

// /metrics of every service is valid Prometheus text (promtool) and has
// the docs/ARCHITECTURE.md §4 names.
TEST_F(ServicesTest, MetricsPassPromtool) {
  ASSERT_TRUE(WaitFor([&] { return RouterSeesDrafter(); }, 10000));
  Generated g =
      Generate(stub_.get(), IdsRequest(RandomPrompt(9, 300, 4), 16, 8, 3));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  struct Service {
    std::string name;
    int port;
    std::vector<std::string> required;
  };
  const std::vector<Service> services = {
      {"router",
       cluster_.router()->metrics_port(),
       {"dedit_spec_decode_num_drafts_total",
        "dedit_spec_decode_num_draft_tokens_total",
        "dedit_spec_decode_num_accepted_tokens_total",
        "dedit_spec_decode_acceptance_length_bucket",
        "dedit_edit_outcomes_total", "dedit_round_duration_seconds_bucket",
        "dedit_time_to_first_token_seconds_bucket",
        "dedit_inter_token_latency_seconds_bucket",
        "dedit_request_duration_seconds_bucket", "dedit_requests_total",
        "dedit_requests_running", "dedit_prompt_tokens_total",
        "dedit_generation_tokens_total", "dedit_fallback_rounds_total"}},
      {"target",
       cluster_.target()->metrics_port(),
       {"dedit_target_batch_size_bucket",
        "dedit_target_forward_duration_seconds_bucket",
        "dedit_kv_cache_usage_ratio", "dedit_context_stream_bytes_total"}},
      {"drafter",
       cluster_.drafter()->metrics_port(),
       {"dedit_drafter_pass_duration_seconds_bucket",
        "dedit_drafter_batch_size_bucket", "dedit_drafter_context_tokens",
        "dedit_drafter_draft_wait_seconds_bucket"}},
  };
  const bool have_promtool =
      std::system("command -v promtool >/dev/null 2>&1") == 0;
  for (const Service& s : services) {
    auto text = ServiceCluster::Scrape(s.port);
    ASSERT_TRUE(text.ok()) << s.name << ": " << text.status();
    for (const std::string& name : s.required) {
      EXPECT_THAT(*text, HasSubstr("\n" + name)) << s.name << " lacks " << name;
    }
    if (!have_promtool) continue;
    const std::string path = testing::MakeTempDir() + "/" + s.name + ".prom";
    std::ofstream(path) << *text;
    const std::string command =
        absl::StrCat("promtool check metrics < ", path, " 2>&1");
    FILE* pipe = popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string output;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
    EXPECT_EQ(pclose(pipe), 0) << s.name << ": " << output;
  }
  if (!have_promtool) GTEST_SKIP() << "promtool not installed";
}

// SIGTERM drains: a running stream completes, then the router exits 0.
TEST_F(ServicesTest, SigtermDrainsRunningRequests) {
  std::atomic<bool> got_tokens{false};
  Generated running;
  std::thread t([&] {
    running =
        Generate(stub_.get(), IdsRequest(RandomPrompt(5, 300, 11), 60, 8, 2),
                 60, [&](const Generated& g) {
                   if (!g.tokens.empty()) got_tokens = true;
                 });
  });
  if (!WaitFor([&] { return got_tokens.load(); }, 30000)) {
    t.join();
    FAIL() << "no tokens: " << running.status.error_message();
  }
  const int exit_code = cluster_.router()->Terminate(20000);
  t.join();
  EXPECT_TRUE(running.status.ok()) << running.status.error_message();
  EXPECT_EQ(running.tokens.size(), 60u);
  EXPECT_EQ(exit_code, 0);
}

}  // namespace
}  // namespace dedit
