// StackSet's joins: a list never blocks Update, a newer list drops the
// joins still queued, Stop() drops them too, and a stack that leaves and
// comes back under the same name joins again once the old one is freed.
//
// The stacks point at a socket that listens and never accepts: TCP
// connects (the kernel completes the handshake) and every RPC then waits
// out its deadline, so each join takes the drafter probe's 500 ms, as an
// unresponsive pod's would.
#include "router/stack_set.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dedit {
namespace {

class SilentPort {
 public:
  SilentPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        listen(fd_, 1024) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on loopback";
      return;
    }
    port_ = ntohs(addr.sin_port);
  }
  ~SilentPort() {
    if (fd_ >= 0) close(fd_);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

std::vector<StackAddress> Stacks(const std::string& prefix, int n,
                                 const std::string& address) {
  std::vector<StackAddress> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({absl::StrCat(prefix, i), address, address});
  }
  return out;
}

std::vector<std::string> Names(const StackSet& set) {
  std::vector<std::string> names;
  for (const StackState& s : set.Stacks()) names.push_back(s.name);
  std::sort(names.begin(), names.end());
  return names;
}

// Polls until the set's stacks are exactly `want` (sorted), up to 30 s.
bool Eventually(const StackSet& set, const std::vector<std::string>& want) {
  for (int i = 0; i < 600; ++i) {
    if (Names(set) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

StackSet::Options TwoJoiners() {
  StackSet::Options options;
  options.join_threads = 2;
  options.stack_drain_ms = 0;
  return options;
}

TEST(StackSetTest, ANewerListSupersedesQueuedJoins) {
  SilentPort port;
  StackSet set(nullptr, std::make_shared<prometheus::Registry>(), TwoJoiners());
  // 64 slow joins queued on two threads (32 s one after another) ...
  set.Update(Stacks("old", 64, port.address()));
  // ... replaced before the first two finish.
  set.Update(Stacks("new", 2, port.address()));
  ASSERT_TRUE(Eventually(set, {"new0", "new1"})) << Names(set).size();
  // Only the two joins already running when the list changed, then the new
  // list's two: a superseded join never begins.
  EXPECT_LE(set.joins_started(), 4);
  set.Stop();
}

TEST(StackSetTest, StopDropsQueuedJoins) {
  SilentPort port;
  StackSet set(nullptr, std::make_shared<prometheus::Registry>(), TwoJoiners());
  set.Update(Stacks("s", 64, port.address()));
  set.Stop();  // waits only for the joins in progress
  EXPECT_LE(set.joins_started(), 2);
  EXPECT_TRUE(set.Stacks().empty());
  set.Update(Stacks("late", 1, port.address()));  // ignored after Stop
  EXPECT_TRUE(set.Stacks().empty());
}

TEST(StackSetTest, AStackThatLeftJoinsAgainUnderItsName) {
  SilentPort port;
  SilentPort other;
  StackSet set(nullptr, std::make_shared<prometheus::Registry>(), TwoJoiners());
  set.Update({{"a", port.address(), port.address()}});
  ASSERT_TRUE(Eventually(set, {"a"}));
  set.Update({});
  EXPECT_TRUE(set.Stacks().empty());  // retired at once
  // Back at another address while the old one may still be reaped.
  set.Update(
      {{"a", other.address(), other.address()}, {"b", port.address(), ""}});
  ASSERT_TRUE(Eventually(set, {"a", "b"}));
  set.Stop();
}

}  // namespace
}  // namespace dedit
