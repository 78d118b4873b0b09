// Where the router finds its stacks (scale-out: one router drives many
// target/drafter stacks), re-read periodically:
//
//  * a stacks file, for local runs and tests (loopback has no DNS to
//    change): one stack per line, `name target_host:port [drafter_host:port]`,
//    `#` comments; re-read when its modification time or size changes;
//  * a headless Kubernetes Service, `--stacks_dns
//  host:target_port[:drafter_port]`:
//    every address the name resolves to is one stack pod (the Service lists
//    ready pods only), named by its IP.
//
// A source that cannot be read (file missing, malformed or over its limits,
// DNS failure other than "no such name") keeps the last good list; a name
// that resolves to no address means no stacks. Every stack costs the router
// a loop thread and channels, so a list is bounded (Source::max_stacks) and
// a file larger than Source::max_file_bytes is refused whole, unread.
//
//   StackDiscovery discovery(source, 1000, [&](auto stacks) {
//     stack_set.Update(stacks);
//   });
//   discovery.Start();   // reads once, then polls
//
// Thread-safe; `on_change` runs on the discovery thread (and in Start()).
#ifndef DEDIT_ROUTER_STACK_DISCOVERY_H_
#define DEDIT_ROUTER_STACK_DISCOVERY_H_

#include <cstdint>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "router/stack_set.h"

namespace dedit {

// The stacks file's text → stacks. INVALID_ARGUMENT naming the line when a
// line is malformed or a name repeats, or when it lists more than
// `max_stacks` stacks (0 = no limit).
absl::StatusOr<std::vector<StackAddress>> ParseStacksFile(
    absl::string_view text, int max_stacks = 0);

// `host:target_port[:drafter_port]`.
struct StacksDnsName {
  std::string host;
  int target_port = 0;
  int drafter_port = 0;  // 0 → target-only stacks
};
absl::StatusOr<StacksDnsName> ParseStacksDnsName(absl::string_view spec);

// Resolves `name.host` (IPv4 addresses; IPv6 when it has none): one stack
// per address, sorted. NOT_FOUND when the name has no address (no ready
// pod), UNAVAILABLE on other failures.
absl::StatusOr<std::vector<StackAddress>> ResolveStacks(
    const StacksDnsName& name);

class StackDiscovery {
 public:
  struct Source {
    std::string stacks_file;  // one of the two
    std::string stacks_dns;
    // More stacks than this (file lines, DNS addresses) refuse the whole
    // list; a stacks file over max_file_bytes is refused unread.
    int max_stacks = 64;
    int64_t max_file_bytes = int64_t{1} << 20;
  };
  using OnChange = std::function<void(const std::vector<StackAddress>&)>;

  // REQUIRES: exactly one of source's fields is set and well-formed
  // (Validate).
  StackDiscovery(Source source, int64_t refresh_ms, OnChange on_change);
  ~StackDiscovery();  // Stop()s

  static absl::Status Validate(const Source& source);

  // Reads the source once (calling on_change), then polls every
  // refresh_ms on a thread until Stop().
  void Start();
  void Stop();

 private:
  void Poll();  // one read; on_change when the list changed
  absl::StatusOr<std::vector<StackAddress>> Read();

  const Source source_;
  const int64_t refresh_ms_;
  const OnChange on_change_;
  // Discovery-thread state (and Start's, before the thread exists).
  bool have_list_ = false;
  std::vector<StackAddress> current_;
  std::timespec file_mtime_{};
  int64_t file_size_ = -1;
  std::string last_error_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace dedit

#endif  // DEDIT_ROUTER_STACK_DISCOVERY_H_
