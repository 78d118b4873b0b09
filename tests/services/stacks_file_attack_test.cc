// A hostile stacks file against a live dedit-router: a 100,000-line file
// (over --max_stacks_file_bytes) and one line over --max_stacks are
// refused whole while the router keeps serving its last good list, with
// its thread count bounded; a good rewrite after them applies within 2 s;
// SIGTERM still ends the router within its drain.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "dedit/v1/services.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"
#include "tests/services/service_cluster.h"
#include "tests/services/stream_client.h"

namespace dedit {
namespace {

using testing::Generate;
using testing::IdsRequest;
using testing::RandomPrompt;
using testing::ServiceCluster;
using testing::ServiceProcess;
using testing::WaitFor;

int Threads(pid_t pid) {
  return static_cast<int>(testing::ProcStatusValue(pid, "Threads"));
}

// Replaces `path` at once (readers never see half a file).
void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path + ".tmp") << text;
  std::filesystem::rename(path + ".tmp", path);
}

TEST(StacksFileAttackTest, HugeListsAreRefusedWhileTheRouterServes) {
  ServiceCluster cluster;
  ASSERT_TRUE(cluster.Start().ok());
  const std::string target =
      absl::StrCat("127.0.0.1:", cluster.target()->grpc_port());
  const std::string drafter =
      absl::StrCat("127.0.0.1:", cluster.drafter()->grpc_port());
  const std::string dir = testing::MakeTempDir();
  const std::string stacks = dir + "/stacks.txt";
  WriteFile(stacks, absl::StrCat("a ", target, " ", drafter, "\n"));
  auto router = ServiceProcess::Start(
      DEDIT_ROUTER_BINARY,
      {"--stacks_file=" + stacks, "--stacks_refresh_ms=100",
       "--stack_drain_ms=1000", "--host=127.0.0.1", "--port=0",
       "--metrics_port=0", "--drain_timeout_ms=1000"},
      dir, "router");
  ASSERT_TRUE(router.ok()) << router.status();
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*router)->grpc_port()),
                          grpc::InsecureChannelCredentials()));
  auto serves = [&] {
    return Generate(stub.get(), IdsRequest(RandomPrompt(12, 120, 5), 8, 8, 2))
        .status.ok();
  };
  ASSERT_TRUE(WaitFor(serves, 20000));
  const int threads_serving = Threads((*router)->pid());

  // 100,000 stacks (about 5 MB, refused unread), then 65 (under the byte
  // limit, one over --max_stacks): refused whole, the router keeps "a".
  std::string huge;
  for (int i = 0; i < 100000; ++i) {
    absl::StrAppend(&huge, "s", i, " 10.0.", i / 256 % 256, ".", i % 256,
                    ":50051 10.0.0.1:50052\n");
  }
  WriteFile(stacks, huge);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_TRUE(serves());
  EXPECT_LE(Threads((*router)->pid()), 64);
  std::string over;
  for (int i = 0; i < 65; ++i) {
    absl::StrAppend(&over, "s", i, " 127.0.0.1:1 127.0.0.1:2\n");
  }
  WriteFile(stacks, over);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_TRUE(serves());
  const int threads_after = Threads((*router)->pid());
  EXPECT_LE(threads_after, 64);
  std::printf(
      "[ stacks file ] router threads: %d serving, %d after the "
      "refused lists\n",
      threads_serving, threads_after);
  std::ifstream log((*router)->log_path());
  const std::string text((std::istreambuf_iterator<char>(log)),
                         std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("--max_stacks_file_bytes"), std::string::npos) << text;
  EXPECT_NE(text.find("--max_stacks"), std::string::npos) << text;

  // A good rewrite applies within 2 s: stack "b" replaces "a".
  WriteFile(stacks, absl::StrCat("b ", target, " ", drafter, "\n"));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(WaitFor(
      [&] {
        auto metrics = ServiceCluster::Scrape((*router)->metrics_port());
        return metrics.ok() &&
               ServiceCluster::MetricValue(*metrics, "dedit_stack_reachable",
                                           "stack=\"b\"") == 1 &&
               ServiceCluster::MetricValue(*metrics, "dedit_stack_reachable",
                                           "stack=\"a\"") == 0;
      },
      2000))
      << "the good rewrite was not applied within 2 s";
  std::printf("[ stacks file ] good rewrite applied after %lld ms\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count()));
  EXPECT_TRUE(serves());
  // SIGTERM: drained (--drain_timeout_ms 1000) and gone well within 10 s.
  EXPECT_EQ((*router)->Terminate(10000), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dedit
