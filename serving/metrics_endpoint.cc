#include "serving/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dedit {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetricsEndpoint(
    const std::string& address,
    std::shared_ptr<prometheus::Registry> registry) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError("metrics address needs host:port, got " +
                                      address);
  }
  const std::string host = address.substr(0, colon);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0") {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  } else if (host == "localhost") {
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError("metrics host must be an IPv4 address: " +
                                      host);
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError("metrics: socket() failed");
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return absl::UnavailableError("metrics: cannot listen on " + address);
  }
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(registry), fd, ntohs(addr.sin_port)));
}

MetricsEndpoint::MetricsEndpoint(std::shared_ptr<prometheus::Registry> registry,
                                 int listen_fd, int port)
    : registry_(std::move(registry)), listen_fd_(listen_fd), port_(port) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsEndpoint::~MetricsEndpoint() {
  shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  thread_.join();
  close(listen_fd_);
}

void MetricsEndpoint::Serve() {
  while (true) {
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    timeval timeout{2, 0};
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    std::string request;
    char buf[4096];
    while (request.find("\r\n\r\n") == std::string::npos &&
           request.size() < 65536) {
      const ssize_t n = read(conn, buf, sizeof(buf));
      if (n <= 0) break;
      request.append(buf, static_cast<size_t>(n));
    }
    std::string status = "200 OK", body;
    const bool metrics = absl::StartsWith(request, "GET /metrics ") ||
                         absl::StartsWith(request, "GET /metrics?") ||
                         absl::StartsWith(request, "GET / ");
    if (metrics) {
      body = prometheus::TextSerializer().Serialize(registry_->Collect());
    } else {
      status = "404 Not Found";
      body = "try /metrics\n";
    }
    const std::string response = absl::StrCat(
        "HTTP/1.1 ", status,
        "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8"
        "\r\nContent-Length: ",
        body.size(), "\r\nConnection: close\r\n\r\n", body);
    size_t sent = 0;
    while (sent < response.size()) {
      const ssize_t n = send(conn, response.data() + sent,
                             response.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    close(conn);
  }
}

}  // namespace dedit
