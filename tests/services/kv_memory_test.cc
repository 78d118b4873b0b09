// KV memory against the attack that found it: the bundled pair
// (checkpoints/tiny) serving one 1,020-token request, then 256 idle
// sessions of 15 tokens each. The target's RSS must stay within 300 MB of
// where it started and fall back within 10 s of the sessions' release;
// Info's kv_bytes_held follows kv_bytes_in_use (the sessions are parked).
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

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
using testing::ServiceProcess;
using testing::SessionClient;
using testing::TokensTurn;
using testing::WaitFor;

const std::string kCheckpoints =
    std::string(DEDIT_SOURCE_DIR) + "/checkpoints/tiny";

int64_t RssBytes(pid_t pid) {
  return testing::ProcStatusValue(pid, "VmRSS") * 1024;
}

TEST(KvMemoryTest, IdleSessionsAfterALongRequestKeepTheTargetSmall) {
  const std::string dir = testing::MakeTempDir();
  const std::vector<std::string> common = {"--host=127.0.0.1", "--port=0",
                                           "--metrics_port=0",
                                           "--drain_timeout_ms=1000"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), common.begin(), common.end());
    return args;
  };
  auto drafter = ServiceProcess::Start(
      DEDIT_DRAFTER_BINARY,
      with({"--drafter_dir=" + kCheckpoints + "/drafter",
            "--target_dir=" + kCheckpoints + "/target", "--threads=1"}),
      dir, "drafter");
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  const std::string drafter_address =
      absl::StrCat("127.0.0.1:", (*drafter)->grpc_port());
  auto target = ServiceProcess::Start(
      DEDIT_TARGET_BINARY,
      with({"--target_dir=" + kCheckpoints + "/target",
            "--drafter_dir=" + kCheckpoints + "/drafter",
            "--drafter=" + drafter_address, "--threads=1"}),
      dir, "target");
  ASSERT_TRUE(target.ok()) << target.status();
  auto router = ServiceProcess::Start(
      DEDIT_ROUTER_BINARY,
      with({absl::StrCat("--target=127.0.0.1:", (*target)->grpc_port()),
            "--drafter=" + drafter_address}),
      dir, "router");
  ASSERT_TRUE(router.ok()) << router.status();
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*router)->grpc_port()),
                          grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  auto target_stub = v1::Target::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*target)->grpc_port()),
                          grpc::InsecureChannelCredentials()));
  auto info = [&] {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::TargetInfoResponse r;
    EXPECT_TRUE(target_stub->Info(&c, {}, &r).ok());
    return r;
  };
  ASSERT_TRUE(
      testing::WaitForRouterReady(stub.get(), /*with_drafter=*/true, 30000));
  const pid_t pid = (*target)->pid();
  const int64_t rss_start = RssBytes(pid);

  // One long request: 1,016 prompt tokens + 4 new.
  const testing::Generated long_one =
      Generate(stub.get(), IdsRequest(RandomPrompt(1016, 2000, 9), 4, 8, 2));
  ASSERT_TRUE(long_one.status.ok()) << long_one.status.error_message();
  const int64_t rss_long = RssBytes(pid);
  constexpr int kSessions = 256;
  std::vector<std::unique_ptr<SessionClient>> sessions;
  v1::SessionOpen open;
  open.set_ignore_eos(true);
  for (int i = 0; i < kSessions; ++i) {
    sessions.push_back(std::make_unique<SessionClient>(stub.get()));
    ASSERT_TRUE(sessions.back()->Open(open)) << i;
    const testing::Generated g =
        sessions.back()->Turn(TokensTurn(RandomPrompt(11, 2000, 100 + i), 4));
    ASSERT_TRUE(g.status.ok()) << i << ": " << g.status.error_message();
  }
  ASSERT_TRUE(
      WaitFor([&] { return info().idle_sequences() == kSessions; }, 10000));
  const v1::TargetInfoResponse idle = info();
  const int64_t rss_idle = RssBytes(pid);
  for (auto& session : sessions) EXPECT_TRUE(session->Close().ok());
  sessions.clear();
  ASSERT_TRUE(WaitFor([&] { return info().num_sequences() == 0; }, 10000));
  const auto released = std::chrono::steady_clock::now();
  // RSS falls back (the pool shrank and returned its pages).
  const bool fell = WaitFor(
      [&] { return RssBytes(pid) <= rss_long + (int64_t{32} << 20); }, 10000);
  const double fell_after_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - released)
          .count();
  const int64_t rss_end = RssBytes(pid);
  std::printf(
      "[ kv memory ] target RSS: start %lld MB, after the long request %lld "
      "MB, %d idle sessions %lld MB (cached %lld tokens, KV in use %lld KB, "
      "held %lld KB), released %lld MB after %.1f s\n",
      static_cast<long long>(rss_start >> 20),
      static_cast<long long>(rss_long >> 20), kSessions,
      static_cast<long long>(rss_idle >> 20),
      static_cast<long long>(idle.cached_tokens()),
      static_cast<long long>(idle.kv_bytes_in_use() >> 10),
      static_cast<long long>(idle.kv_bytes_held() >> 10),
      static_cast<long long>(rss_end >> 20), fell_after_s);
  EXPECT_LE(rss_idle - rss_start, int64_t{300} << 20);
  EXPECT_TRUE(fell) << "RSS " << (rss_end >> 20) << " MB 10 s after release";
  // Held: the sessions' tokens (whole 16-token key blocks) plus the pool's
  // initial 4 x 256 slots, nothing like a 1,024-token slab each.
  const int64_t token_bytes = idle.kv_bytes_in_use() / idle.cached_tokens();
  EXPECT_LE(idle.kv_bytes_held() / token_bytes,
            idle.cached_tokens() + kSessions * 16 + 4 * 256);
}

}  // namespace
}  // namespace dedit
