// The HTTP server's count of open connections, in total and per client
// address (--max_connections, --max_connections_per_client), and the
// connections themselves, so that a shutdown can close them all.
//
//   ConnectionTable table(1024, 32);
//   if (int refusal = table.TryCount("10.0.0.7")) { answer refusal; }
//   ...
//   table.Release("10.0.0.7");  // when that connection closes
//
// Thread-safe.
#ifndef DEDIT_GATEWAY_CONNECTION_TABLE_H_
#define DEDIT_GATEWAY_CONNECTION_TABLE_H_

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dedit {

class HttpConnection;

class ConnectionTable {
 public:
  ConnectionTable(int max_total, int max_per_client)
      : max_total_(max_total), max_per_client_(max_per_client) {}

  // 0 when counted (until Release), else the refusal's status: 503 for
  // the total, 429 for the client's share.
  int TryCount(const std::string& client) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (total_ >= max_total_) return 503;
    int& open = per_client_[client];
    if (open >= max_per_client_) return 429;
    ++open;
    ++total_;
    return 0;
  }
  void Release(const std::string& client) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    --total_;
    auto it = per_client_.find(client);
    if (it != per_client_.end() && --it->second <= 0) per_client_.erase(it);
  }

  void Track(HttpConnection* key, std::weak_ptr<HttpConnection> connection)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    tracked_[key] = std::move(connection);
  }
  void Untrack(HttpConnection* key) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    tracked_.erase(key);
  }
  std::vector<std::shared_ptr<HttpConnection>> Tracked()
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::vector<std::shared_ptr<HttpConnection>> out;
    for (const auto& [key, weak] : tracked_) {
      if (auto connection = weak.lock()) out.push_back(std::move(connection));
    }
    return out;
  }

 private:
  const int max_total_;
  const int max_per_client_;
  absl::Mutex mu_;
  int total_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_map<std::string, int> per_client_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<HttpConnection*, std::weak_ptr<HttpConnection>> tracked_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace dedit

#endif  // DEDIT_GATEWAY_CONNECTION_TABLE_H_
