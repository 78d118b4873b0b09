// Stack discovery: the stacks file format, --stacks_dns names,
// DNS resolution, and a discovery that re-reads a changed file.
#include "router/stack_discovery.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dedit {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(StacksFileTest, ParsesNamesAddressesAndComments) {
  auto stacks = ParseStacksFile(
      "# name target drafter\n"
      "a 10.0.0.1:50051 10.0.0.1:50052\n"
      "\n"
      "  b\t10.0.0.2:50051   # target-only\n");
  ASSERT_TRUE(stacks.ok()) << stacks.status();
  ASSERT_EQ(stacks->size(), 2u);
  EXPECT_EQ((*stacks)[0],
            (StackAddress{"a", "10.0.0.1:50051", "10.0.0.1:50052"}));
  EXPECT_EQ((*stacks)[1], (StackAddress{"b", "10.0.0.2:50051", ""}));
  auto empty = ParseStacksFile("# nothing yet\n");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(StacksFileTest, MalformedLinesAreInvalidArgumentNamingTheLine) {
  for (const char* text :
       {"a\n", "a b:1 c:2 d:3\n", "a host 127.0.0.1:2\n", "a 127.0.0.1:0\n",
        "a 127.0.0.1:1\na 127.0.0.1:2\n"}) {
    auto stacks = ParseStacksFile(text);
    EXPECT_EQ(stacks.status().code(), absl::StatusCode::kInvalidArgument)
        << text;
    EXPECT_THAT(std::string(stacks.status().message()), HasSubstr("line"));
  }
}

TEST(StacksDnsTest, ParsesHostAndPorts) {
  auto name = ParseStacksDnsName("dedit-stack.dedit.svc:50051:50052");
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ(name->host, "dedit-stack.dedit.svc");
  EXPECT_EQ(name->target_port, 50051);
  EXPECT_EQ(name->drafter_port, 50052);
  auto target_only = ParseStacksDnsName("stack:7");
  ASSERT_TRUE(target_only.ok());
  EXPECT_EQ(target_only->drafter_port, 0);
  for (const char* bad :
       {"stack", ":1:2", "stack:x:2", "stack:1:70000", "stack:1:2:3"}) {
    EXPECT_EQ(ParseStacksDnsName(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(StacksDnsTest, EveryAddressIsOneStackNamedByItsIp) {
  auto stacks = ResolveStacks({"127.0.0.1", 50051, 50052});
  ASSERT_TRUE(stacks.ok()) << stacks.status();
  EXPECT_THAT(*stacks, ElementsAre(StackAddress{"127.0.0.1", "127.0.0.1:50051",
                                                "127.0.0.1:50052"}));
  auto local = ResolveStacks({"localhost", 1, 0});
  ASSERT_TRUE(local.ok()) << local.status();
  ASSERT_EQ(local->size(), 1u);  // IPv4 only when there is any
  EXPECT_EQ((*local)[0].drafter_address, "");
  // NOT_FOUND from a resolver that answers, UNAVAILABLE without one.
  EXPECT_FALSE(ResolveStacks({"no-such-stack.invalid", 1, 2}).ok());
}

TEST(StackDiscoveryTest, SourceMustBeExactlyOneWellFormed) {
  EXPECT_FALSE(StackDiscovery::Validate({}).ok());
  EXPECT_FALSE(StackDiscovery::Validate({"f", "h:1"}).ok());
  EXPECT_FALSE(StackDiscovery::Validate({"", "h"}).ok());
  EXPECT_TRUE(StackDiscovery::Validate({"f", ""}).ok());
  EXPECT_TRUE(StackDiscovery::Validate({"", "h:1:2"}).ok());
}

// The file is re-read when it changes; a broken rewrite keeps the last good
// list.
TEST(StackDiscoveryTest, RereadsTheFileWhenItChanges) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("stacks_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/stacks.txt";
  auto write = [&](const std::string& text) {
    std::ofstream(path + ".tmp") << text;
    std::filesystem::rename(path + ".tmp", path);
  };
  write("a 127.0.0.1:1 127.0.0.1:2\n");
  absl::Mutex mu;
  std::vector<std::vector<StackAddress>> seen;
  StackDiscovery discovery({path, ""}, 20,
                           [&](const std::vector<StackAddress>& stacks) {
                             absl::MutexLock lock(&mu);
                             seen.push_back(stacks);
                           });
  discovery.Start();
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(seen.size(), 1u);  // Start() read it
    EXPECT_EQ(seen[0].size(), 1u);
  }
  write("a 127.0.0.1:1 127.0.0.1:2\nb 127.0.0.1:3 127.0.0.1:4\n");
  auto two_lists = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return seen.size() >= 2;
  };
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(
        mu.AwaitWithTimeout(absl::Condition(&two_lists), absl::Seconds(10)));
    EXPECT_EQ(seen[1].size(), 2u);
  }
  write("garbage\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  discovery.Stop();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(seen.size(), 2u);
  std::filesystem::remove_all(dir);
}

TEST(StacksFileTest, MoreStacksThanTheLimitRefuseTheWholeList) {
  const std::string three =
      "a 127.0.0.1:1\nb 127.0.0.1:2\n# c is next\nc 127.0.0.1:3\n";
  EXPECT_EQ(ParseStacksFile(three, 3)->size(), 3u);
  auto refused = ParseStacksFile(three, 2);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("line 4: more than 2 stacks"));
}

// A hostile or mistaken stacks file (a 100,000-line one, or more stacks
// than --max_stacks) is refused whole; the last good list stays, and a good
// rewrite after it is applied at the next poll.
TEST(StackDiscoveryTest, OversizedFilesAreRefusedAndTheLastGoodListKept) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("stacks_big_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/stacks.txt";
  auto write = [&](const std::string& text) {
    std::ofstream(path + ".tmp") << text;
    std::filesystem::rename(path + ".tmp", path);
  };
  auto lines = [](int n) {
    std::string text;
    for (int i = 0; i < n; ++i) {
      text += "s" + std::to_string(i) +
              " 127.0.0.1:" + std::to_string(1 + i % 60000) + "\n";
    }
    return text;
  };
  write(lines(2));
  absl::Mutex mu;
  std::vector<std::vector<StackAddress>> seen;
  StackDiscovery::Source source{path, ""};
  source.max_stacks = 64;
  source.max_file_bytes = 1 << 20;
  StackDiscovery discovery(source, 20,
                           [&](const std::vector<StackAddress>& stacks) {
                             absl::MutexLock lock(&mu);
                             seen.push_back(stacks);
                           });
  discovery.Start();
  write(lines(100000));  // ~2.5 MB: refused unread
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  write(lines(65));  // small, but one stack too many
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(seen.size(), 1u) << "a refused list was applied";
    EXPECT_EQ(seen[0].size(), 2u);
  }
  write(lines(3));
  auto applied = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return seen.size() >= 2;
  };
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(
        mu.AwaitWithTimeout(absl::Condition(&applied), absl::Seconds(10)));
    EXPECT_EQ(seen[1].size(), 3u);
  }
  discovery.Stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dedit
