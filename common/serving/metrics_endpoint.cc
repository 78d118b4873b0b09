#include "common/serving/metrics_endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace dedit {
namespace {

using Clock = std::chrono::steady_clock;

// When the connection a pool thread is about to serve was accepted (set by
// AcceptTimeTaskQueue right before the task runs on that thread).
thread_local Clock::time_point connection_accepted;

// cpp-httplib's thread pool, recording each connection's accept time so
// that the deadline also covers the time it waited for a thread.
class AcceptTimeTaskQueue final : public httplib::TaskQueue {
 public:
  explicit AcceptTimeTaskQueue(size_t threads) : pool_(threads) {}
  void enqueue(std::function<void()> fn) override {
    pool_.enqueue([fn = std::move(fn), accepted = Clock::now()] {
      connection_accepted = accepted;
      fn();
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  httplib::ThreadPool pool_;
};

// A connection's socket as cpp-httplib's Stream, every read and write
// bounded by the connection's deadline (instead of cpp-httplib's per-read
// timeout) and reads by a byte budget.
class DeadlineSocketStream final : public httplib::Stream {
 public:
  DeadlineSocketStream(int fd, Clock::time_point deadline, int max_read_bytes)
      : fd_(fd), deadline_(deadline), read_budget_(max_read_bytes) {}

  bool is_readable() const override { return Wait(POLLIN); }
  bool is_writable() const override { return Wait(POLLOUT); }

  ssize_t read(char* ptr, size_t size) override {
    if (size == 0) return 0;
    if (buffered_ == consumed_) {
      if (read_budget_ <= 0 || !Wait(POLLIN)) return -1;
      const size_t want =
          std::min(sizeof(buffer_), static_cast<size_t>(read_budget_));
      ssize_t n;
      do {
        n = recv(fd_, buffer_, want, 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      read_budget_ -= static_cast<int>(n);
      buffered_ = static_cast<size_t>(n);
      consumed_ = 0;
    }
    const size_t n = std::min(size, buffered_ - consumed_);
    std::memcpy(ptr, buffer_ + consumed_, n);
    consumed_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!Wait(POLLOUT)) return -1;
    ssize_t n;
    do {
      n = send(fd_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  // Waits for `events` until the deadline; false once it has passed or the
  // socket failed.
  bool Wait(short events) const {
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline_ - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, events, 0};
      const int r = poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      return r > 0 && (p.revents & (events | POLLHUP)) != 0 &&
             (p.revents & (POLLERR | POLLNVAL)) == 0;
    }
  }

  void Address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip,
               int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    ip.clear();
    port = 0;
    if (get(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    char text[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
      inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
      port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
      inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
      port = ntohs(a->sin6_port);
    }
    ip = text;
  }

  const int fd_;
  const Clock::time_point deadline_;
  int read_budget_;
  char buffer_[4096];
  size_t buffered_ = 0;
  size_t consumed_ = 0;
};

}  // namespace

// cpp-httplib's server with its per-connection routine replaced:
// Server::process_and_close_socket is the virtual that SSLServer overrides
// the same way. One request per connection, within the deadline; the open
// connections are tracked so that the destructor can close them.
class MetricsEndpoint::HttpServer final : public httplib::Server {
 public:
  explicit HttpServer(const MetricsEndpointOptions& options)
      : options_(options) {}

  // Closes every connection being served: their reads and writes fail at
  // once, so the pool's threads finish. Call after stop().
  void CloseConnections() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    for (int fd : open_) shutdown(fd, SHUT_RDWR);
  }

 private:
  bool process_and_close_socket(socket_t sock) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    bool served = false;
    if (Track(sock)) {
      DeadlineSocketStream stream(
          sock, connection_accepted + options_.request_deadline,
          options_.max_request_bytes);
      bool connection_closed = false;
      served = process_request(stream, /*close_connection=*/true,
                               connection_closed, nullptr);
    }
    {
      // Untracked before it is closed: the descriptor may be reused.
      absl::MutexLock lock(&mu_);
      open_.erase(sock);
    }
    shutdown(sock, SHUT_RDWR);
    close(sock);
    return served;
  }

  // False once closing: the connection is closed unserved.
  bool Track(int fd) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (closing_) return false;
    open_.insert(fd);
    return true;
  }

  const MetricsEndpointOptions options_;
  absl::Mutex mu_;
  std::set<int> open_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry,
    const MetricsEndpointOptions& options) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError("metrics address needs host:port, got " +
                                      address);
  }
  std::string host = address.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  if (host == "localhost") host = "127.0.0.1";
  in_addr parsed{};
  if (inet_pton(AF_INET, host.c_str(), &parsed) != 1) {
    return absl::InvalidArgumentError("metrics host must be an IPv4 address: " +
                                      host);
  }
  if (options.threads < 1 || options.request_deadline.count() < 1 ||
      options.max_request_bytes < 256) {
    return absl::InvalidArgumentError(
        "metrics endpoint: threads >= 1, request_deadline >= 1 ms and "
        "max_request_bytes >= 256 required");
  }

  auto server = std::make_unique<MetricsEndpoint::HttpServer>(options);
  const auto serve = [registry](const httplib::Request&,
                                httplib::Response& res) {
    res.set_content(prometheus::TextSerializer().Serialize(registry->Collect()),
                    "text/plain; version=0.0.4; charset=utf-8");
  };
  server->Get("/metrics", serve);
  server->Get("/", serve);
  server->set_error_handler(
      [](const httplib::Request&, httplib::Response& res) {
        if (res.status == 404) res.set_content("try /metrics\n", "text/plain");
      });
  const size_t threads = static_cast<size_t>(options.threads);
  server->new_task_queue = [threads] {
    return new AcceptTimeTaskQueue(threads);
  };
  // A GET has no body.
  server->set_payload_max_length(4096);
  // cpp-httplib's default sets SO_REUSEPORT, which would let a second
  // process bind the same port; SO_REUSEADDR only rebinds after a restart.
  server->set_socket_options([](socket_t fd) {
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    fcntl(fd, F_SETFD, FD_CLOEXEC);
  });
  int bound = port;
  errno = 0;
  if (port == 0) {
    bound = server->bind_to_any_port(host);
  } else if (!server->bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound <= 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", address, ": ",
                     errno != 0 ? std::strerror(errno) : "bind failed"));
  }
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(server), bound));
}

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<HttpServer> server, int port)
    : server_(std::move(server)), port_(port) {
  thread_ = std::thread([this] {
    server_->listen_after_bind();
    loop_ended_ = true;
  });
  // stop() only acts on a running server: wait until the loop has started,
  // so that the destructor cannot miss it.
  while (!server_->is_running() && !loop_ended_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

MetricsEndpoint::~MetricsEndpoint() {
  server_->stop();  // closes the listening socket: the accept loop ends
  server_->CloseConnections();
  thread_.join();  // after the pool's threads finished their connections
}

}  // namespace dedit
