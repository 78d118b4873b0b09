// Scale-out: three stacks (a dedit-target streaming context to
// its dedit-drafter each) behind routers that find them in a stacks file,
// all real processes on loopback. Load spreads over every stack with
// target-only greedy output; a stack that dies loses no request (its
// streams move to another stack), new requests avoid it, and it takes work
// again once it is back.
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
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
using testing::StackCluster;
using testing::WaitFor;

constexpr int kWindow = 8;
constexpr int kPasses = 2;

class StacksTest : public ::testing::Test {
 protected:
  void StartCluster(int routers) {
    cluster_ = std::make_unique<StackCluster>(
        StackCluster::Options{.stacks = 3, .routers = routers});
    const absl::Status started = cluster_->Start();
    ASSERT_TRUE(started.ok()) << started;
    for (int r = 0; r < routers; ++r) {
      stubs_.push_back(v1::Generation::NewStub(cluster_->RouterChannel(r)));
      for (int i = 0; i < cluster_->num_stacks(); ++i) {
        ASSERT_TRUE(WaitFor([&] { return Reachable(r, i); }, 20000))
            << "router " << r << " never reached stack " << i;
      }
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

  std::string Metrics(int router) {
    auto text =
        ServiceCluster::Scrape(cluster_->router(router)->metrics_port());
    return text.value_or("");
  }
  // A per-stack series of router `router` (0 when absent).
  double StackMetric(int router, const std::string& name, int stack,
                     const std::string& more_labels = "") {
    return ServiceCluster::MetricValue(
        Metrics(router), name,
        absl::StrCat("stack=\"", StackCluster::StackName(stack), "\"",
                     more_labels));
  }
  double OkOn(int router, int stack) {
    return StackMetric(router, "dedit_stack_requests_total", stack,
                       ",status=\"ok\"");
  }
  bool Reachable(int router, int stack) {
    return StackMetric(router, "dedit_stack_reachable", stack) == 1;
  }

  // `n` requests one after the other (each admitted on idle stacks, so the
  // round-robin tie-break alone decides), each checked against greedy.
  void SequentialRequests(int router, int n, uint64_t seed, int max_tokens) {
    for (int i = 0; i < n; ++i) {
      const std::vector<int32_t> prompt = RandomPrompt(5, 300, seed + i);
      Generated g = Generate(stubs_[router].get(),
                             IdsRequest(prompt, max_tokens, kWindow, kPasses));
      ASSERT_TRUE(g.status.ok()) << g.status.error_message();
      EXPECT_THAT(g.tokens, ElementsAreArray(Greedy(prompt, max_tokens)));
    }
  }

  std::unique_ptr<StackCluster> cluster_;
  std::vector<std::unique_ptr<v1::Generation::Stub>> stubs_;
  std::unique_ptr<InProcessStack> reference_;
};

// Two routers share three stacks: concurrent load reaches every stack from
// both routers, every output is the target's greedy output, and requests
// admitted on idle stacks go round-robin.
TEST_F(StacksTest, LoadSpreadsOverEveryStackWithGreedyOutput) {
  StartCluster(/*routers=*/2);
  constexpr int kRequests = 12, kNew = 24;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kRequests; ++i) {
    prompts.push_back(RandomPrompt(6, 300, 100 + i));
  }
  std::vector<Generated> results(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      results[i] = Generate(stubs_[i % 2].get(),
                            IdsRequest(prompts[i], kNew, kWindow, kPasses));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_THAT(results[i].tokens, ElementsAreArray(Greedy(prompts[i], kNew)))
        << "request " << i;
  }
  std::string distribution;
  double total = 0;
  for (int s = 0; s < 3; ++s) {
    for (int r = 0; r < 2; ++r) {
      const double ok = OkOn(r, s);
      EXPECT_GE(ok, 1) << "router " << r << " sent nothing to stack " << s;
      total += ok;
      absl::StrAppend(&distribution, " router", r, "->s", s, "=", ok);
    }
  }
  EXPECT_EQ(total, kRequests);
  std::printf("concurrent distribution:%s\n", distribution.c_str());

  // Idle stacks: ties broken round-robin, so 6 requests give 2 each.
  std::vector<double> before;
  for (int s = 0; s < 3; ++s) before.push_back(OkOn(0, s));
  SequentialRequests(0, 6, 200, 8);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(OkOn(0, s) - before[s], 2) << s;
}

// A stack dies mid-load: its running streams move to the other stacks and
// complete with greedy output (failover; tests/services/failover_test.cc
// covers it in depth), the others are untouched; new requests avoid it;
// restarted, it takes requests again.
TEST_F(StacksTest, KilledStackMovesItsStreamsAndRejoinsWhenBack) {
  StartCluster(/*routers=*/1);
  constexpr int kStreams = 9, kNew = 240;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kStreams; ++i) {
    prompts.push_back(RandomPrompt(6, 300, 300 + i));
  }
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < kStreams; ++i) {
    requests.push_back(IdsRequest(prompts[i], kNew, kWindow, kPasses));
  }
  ConcurrentStreams streams(stubs_[0].get(), requests);
  std::vector<Generated>& results = streams.results;
  ASSERT_TRUE(
      WaitFor([&] { return streams.started.load() == kStreams; }, 60000));
  const double running_on_s1 =
      StackMetric(0, "dedit_stack_requests_running", 1);
  cluster_->KillStack(1);
  streams.Join();
  EXPECT_GE(running_on_s1, 1);

  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_THAT(results[i].tokens, ElementsAreArray(Greedy(prompts[i], kNew)))
        << i;
  }
  std::printf(
      "stack s1 killed with %.0f of %d requests running on it: all completed "
      "with greedy output (ok per stack: s0=%.0f s1=%.0f s2=%.0f)\n",
      running_on_s1, kStreams, OkOn(0, 0), OkOn(0, 1), OkOn(0, 2));
  EXPECT_EQ(running_on_s1, StackMetric(0, "dedit_stack_requests_total", 1,
                                       ",status=\"rerouted\""));
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(StackMetric(0, "dedit_stack_requests_total", s,
                          ",status=\"unavailable\""),
              0);
  }
  EXPECT_FALSE(Reachable(0, 1));

  // New requests avoid the dead stack.
  const double s1_ok = OkOn(0, 1);
  SequentialRequests(0, 4, 400, 8);
  EXPECT_EQ(OkOn(0, 1), s1_ok);

  // Back on its old ports: the router's probe finds it, it serves again.
  ASSERT_TRUE(cluster_->RestartStack(1).ok());
  ASSERT_TRUE(WaitFor([&] { return Reachable(0, 1); }, 20000));
  SequentialRequests(0, 6, 500, 8);
  EXPECT_EQ(OkOn(0, 1) - s1_ok, 2);
}

// A stack that died while idle is found out by the first request sent to
// it: the failed prefill produced no token, so the request moves to another
// stack and the client never sees the failure.
TEST_F(StacksTest, RequestWithoutATokenMovesToAnotherStack) {
  StartCluster(/*routers=*/1);
  cluster_->KillStack(2);
  SequentialRequests(0, 3, 600, 8);
  EXPECT_EQ(
      StackMetric(0, "dedit_stack_requests_total", 2, ",status=\"rerouted\""),
      1);
  EXPECT_EQ(OkOn(0, 0) + OkOn(0, 1), 3);
  EXPECT_FALSE(Reachable(0, 2));
}

// Discovery: a stack removed from the stacks file takes no new request but
// drains its running one (a pod being replaced); its series go away once it
// has. Listed again, it is used again.
TEST_F(StacksTest, StackLeavingDiscoveryDrainsAndReturns) {
  StartCluster(/*routers=*/1);
  constexpr int kStreams = 3, kNew = 160;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kStreams; ++i) {
    prompts.push_back(RandomPrompt(6, 300, 900 + i));
  }
  // Three at once on idle stacks: one each.
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < kStreams; ++i) {
    requests.push_back(IdsRequest(prompts[i], kNew, kWindow, kPasses));
  }
  ConcurrentStreams streams(stubs_[0].get(), requests);
  std::vector<Generated>& results = streams.results;
  ASSERT_TRUE(
      WaitFor([&] { return streams.started.load() == kStreams; }, 60000));
  const double running_on_s2 =
      StackMetric(0, "dedit_stack_requests_running", 2);
  ASSERT_TRUE(cluster_->WriteStacksFile({0, 1}).ok());
  streams.Join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_THAT(results[i].tokens, ElementsAreArray(Greedy(prompts[i], kNew)));
  }
  EXPECT_EQ(running_on_s2, 1);
  ASSERT_TRUE(WaitFor(
      [&] { return Metrics(0).find("stack=\"s2\"") == std::string::npos; },
      10000));
  SequentialRequests(0, 4, 700, 8);
  EXPECT_EQ(OkOn(0, 0) + OkOn(0, 1), kStreams - 1 + 4);

  ASSERT_TRUE(cluster_->WriteStacksFile({0, 1, 2}).ok());
  ASSERT_TRUE(WaitFor([&] { return Reachable(0, 2); }, 10000));
  SequentialRequests(0, 3, 800, 8);
  EXPECT_EQ(OkOn(0, 2), 1);
}

// --stacks_dns: a router resolving a name finds the stack behind each
// address (loopback has one address, so one stack; a headless Service
// gives one per pod) and serves through it.
TEST(StacksDnsDiscoveryTest, RouterFindsTheStackBehindAName) {
  StackCluster cluster(StackCluster::Options{.stacks = 1, .routers = 0});
  ASSERT_TRUE(cluster.Start().ok());
  auto router = testing::ServiceProcess::Start(
      DEDIT_ROUTER_BINARY,
      {absl::StrCat("--stacks_dns=localhost:", cluster.target(0)->grpc_port(),
                    ":", cluster.drafter(0)->grpc_port()),
       "--stacks_refresh_ms=200", "--host=127.0.0.1", "--port=0",
       "--metrics_port=0"},
      testing::MakeTempDir(), "router_dns");
  ASSERT_TRUE(router.ok()) << router.status();
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*router)->grpc_port()),
                          grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(WaitFor(
      [&] {
        auto text = ServiceCluster::Scrape((*router)->metrics_port());
        return text.ok() &&
               ServiceCluster::MetricValue(*text, "dedit_stack_reachable",
                                           "stack=\"127.0.0.1\"") == 1;
      },
      20000));
  const std::vector<int32_t> prompt = RandomPrompt(5, 300, 77);
  Generated g = Generate(stub.get(), IdsRequest(prompt, 12, kWindow, kPasses));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  InProcessStack::Options o;
  o.target_dir = cluster.target_dir();
  o.drafter_dir = cluster.drafter_dir();
  auto reference = InProcessStack::Load(o);
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_THAT(g.tokens, ElementsAreArray(testing::GreedyReference(
                            (*reference)->target(), prompt, 12)));
}

// The router's own CPU per round and per token (docs/SERVICES.md,
// "Scale-out"): user + system time of the router process over a load on
// three stacks, divided by the rounds its requests ran and the tokens it
// streamed. The models are the smallest the services load, so the rounds
// come as fast as this machine allows and the router's share is what is
// measured. Bounds are loose (2 shared cores); the numbers are printed.
TEST_F(StacksTest, RouterCpuPerRoundAndToken) {
  StartCluster(/*routers=*/1);
  auto cpu_seconds = [&] {
    std::ifstream in(
        absl::StrCat("/proc/", cluster_->router(0)->pid(), "/stat"));
    std::string stat((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    // Fields after the ")" of the command name: utime is the 12th, stime
    // the 13th (proc(5) fields 14 and 15).
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::string f;
    double ticks = 0;
    for (int i = 1; i <= 13 && fields >> f; ++i) {
      if (i >= 12) ticks += std::stod(f);
    }
    return ticks / sysconf(_SC_CLK_TCK);
  };
  auto steps = [&] {
    return ServiceCluster::MetricValue(
        Metrics(0), "dedit_round_duration_seconds_count", "phase=\"total\"");
  };
  // `requests` concurrent requests of `new_tokens` each: `requests / 3`
  // per stack, so that is the batch of each loop step.
  auto measure = [&](int requests, int new_tokens, uint64_t seed) {
    const double cpu0 = cpu_seconds(), steps0 = steps();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Generated> results(requests);
    std::vector<std::thread> threads;
    for (int i = 0; i < requests; ++i) {
      threads.emplace_back([&, i] {
        results[i] = Generate(stubs_[0].get(),
                              IdsRequest(RandomPrompt(6, 300, seed + i),
                                         new_tokens, kWindow, kPasses),
                              120);
      });
    }
    for (std::thread& t : threads) t.join();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    const double cpu = cpu_seconds() - cpu0, loop_steps = steps() - steps0;
    double rounds = 0, tokens = 0;
    for (const Generated& g : results) {
      EXPECT_TRUE(g.status.ok()) << g.status.error_message();
      rounds += g.last.acceptance().rounds();
      tokens += g.tokens.size();
    }
    std::printf(
        "router CPU, %d per stack: %.3f s over %.2f s wall (%.0f%% of one "
        "core); %.0f request-rounds, %.0f loop steps, %.0f tokens; "
        "%.1f us/request-round, %.1f us/step, %.1f us/token\n",
        requests / 3, cpu, wall, 100 * cpu / wall, rounds, loop_steps, tokens,
        1e6 * cpu / rounds, 1e6 * cpu / loop_steps, 1e6 * cpu / tokens);
    EXPECT_EQ(tokens, static_cast<double>(requests) * new_tokens);
    EXPECT_GT(cpu, 0);
    EXPECT_LT(cpu / tokens, 0.005) << "more than 5 ms of router CPU per token";
  };
  measure(/*requests=*/3, /*new_tokens=*/480, 1000);
  measure(/*requests=*/24, /*new_tokens=*/160, 2000);
}

}  // namespace
}  // namespace dedit
