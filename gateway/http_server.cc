#include "gateway/http_server.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gateway/connection_table.h"
#include "gateway/http_connection.h"

namespace dedit {

using Clock = std::chrono::steady_clock;

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, Callbacks callbacks)
      : options_(std::move(options)),
        core_(options_.limits, std::move(callbacks)),
        work_(net::make_work_guard(io_)),
        accept_strand_(net::make_strand(io_)),
        acceptor_(accept_strand_),
        accept_retry_(accept_strand_) {}
  ~Impl() { Stop(); }

  absl::StatusOr<int> Start();
  void CloseConnections();
  void Stop();

 private:
  void Accept();
  void OnAccept(tcp::socket socket);

  const HttpServerOptions options_;
  ServerCore core_;  // outlives io_, whose destruction drops connections
  net::io_context io_;
  net::executor_work_guard<net::io_context::executor_type> work_;
  net::strand<net::io_context::executor_type> accept_strand_;
  tcp::acceptor acceptor_;
  net::steady_timer accept_retry_;
  std::vector<std::thread> threads_;
};

absl::StatusOr<int> HttpServer::Impl::Start() {
  beast::error_code ec;
  tcp::resolver resolver(io_);
  const auto endpoints = resolver.resolve(
      options_.host, std::to_string(options_.port),
      tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (!ec && endpoints.empty()) ec = net::error::host_not_found;
  if (!ec) {
    const tcp::endpoint endpoint = endpoints.begin()->endpoint();
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  }
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.host, ":", options_.port,
                     ": ", ec.message()));
  }
  const int port = acceptor_.local_endpoint().port();
  net::post(accept_strand_, [this] { Accept(); });
  for (int i = 0; i < options_.io_threads; ++i) {
    threads_.emplace_back([this] { io_.run(); });
  }
  return port;
}

void HttpServer::Impl::Accept() {
  acceptor_.async_accept(
      net::make_strand(io_), [this](beast::error_code ec, tcp::socket socket) {
        if (ec == net::error::operation_aborted || !acceptor_.is_open()) {
          return;
        }
        if (ec) {
          // Out of descriptors, say: try again shortly instead of spinning.
          accept_retry_.expires_after(std::chrono::milliseconds(100));
          accept_retry_.async_wait([this](beast::error_code wait_ec) {
            if (!wait_ec) Accept();
          });
          return;
        }
        OnAccept(std::move(socket));
        Accept();
      });
}

void HttpServer::Impl::OnAccept(tcp::socket socket) {
  beast::error_code ec;
  const tcp::endpoint peer = socket.remote_endpoint(ec);
  if (ec) return;  // gone already
  socket.set_option(tcp::no_delay(true), ec);
  const std::string client = peer.address().to_string();
  const int refusal = core_.closing ? 503 : core_.table.TryCount(client);
  auto connection = std::make_shared<HttpConnection>(std::move(socket), &core_,
                                                     client, refusal == 0);
  core_.table.Track(connection.get(), connection);
  net::post(connection->executor(), [connection, refusal,
                                     limits = core_.limits] {
    if (refusal == 0) return connection->Start();
    // Decided before any byte is read: a client over its share holds no
    // buffer and no parser.
    connection->Refuse(
        refusal,
        refusal == 429
            ? absl::StrCat("too many connections from your address (at most ",
                           limits.max_connections_per_client, ")")
            : "the server has too many open connections");
  });
}

void HttpServer::Impl::CloseConnections() {
  core_.closing = true;
  net::post(accept_strand_, [this] {
    beast::error_code ignored;
    acceptor_.close(ignored);
    accept_retry_.cancel();
  });
  for (const std::shared_ptr<HttpConnection>& connection :
       core_.table.Tracked()) {
    net::post(connection->executor(), [connection] { connection->Shutdown(); });
  }
}

void HttpServer::Impl::Stop() {
  if (threads_.empty()) return;
  CloseConnections();
  // Answers being written get a moment to finish (a drained stream's last
  // chunk); a client that does not read them loses them.
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  auto any_open = [this] {
    for (const auto& connection : core_.table.Tracked()) {
      if (!connection->closed()) return true;
    }
    return false;
  };
  while (Clock::now() < deadline && any_open()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  work_.reset();
  io_.stop();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
}

HttpServer::HttpServer(HttpServerOptions options, Callbacks callbacks)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(callbacks))) {}
HttpServer::~HttpServer() = default;
absl::StatusOr<int> HttpServer::Start() { return impl_->Start(); }
void HttpServer::CloseConnections() { impl_->CloseConnections(); }
void HttpServer::Stop() { impl_->Stop(); }

absl::Status ValidateHttpServerOptions(const HttpServerOptions& o) {
  const HttpLimits& l = o.limits;
  auto at_least = [](const char* flag, int64_t value,
                     int64_t low) -> absl::Status {
    if (value >= low) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be >= ", low, " (got ", value, ")"));
  };
  for (absl::Status s :
       {at_least("io_threads", o.io_threads, 1),
        at_least("header_timeout_ms", l.header_timeout_ms, 10),
        at_least("body_timeout_ms", l.body_timeout_ms, 10),
        at_least("keep_alive_timeout_s", l.keep_alive_timeout_s, 1),
        at_least("write_timeout_s", l.write_timeout_s, 1),
        at_least("max_request_line_bytes",
                 static_cast<int64_t>(l.max_request_line_bytes), 64),
        at_least("max_header_bytes", static_cast<int64_t>(l.max_header_bytes),
                 1024),
        at_least("max_headers", l.max_headers, 8),
        at_least("max_body_bytes", static_cast<int64_t>(l.max_body_bytes),
                 1024),
        at_least("max_connections", l.max_connections, 1),
        at_least("max_connections_per_client", l.max_connections_per_client,
                 1)}) {
    if (!s.ok()) return s;
  }
  if (o.io_threads > 256) {
    return absl::InvalidArgumentError("--io_threads must be <= 256");
  }
  if (l.max_request_line_bytes > l.max_header_bytes) {
    return absl::InvalidArgumentError(
        "--max_request_line_bytes must be <= --max_header_bytes (the request "
        "line is part of the header)");
  }
  if (l.max_header_bytes > (64u << 20)) {
    return absl::InvalidArgumentError("--max_header_bytes must be <= 64 MiB");
  }
  if (l.max_connections_per_client > l.max_connections) {
    return absl::InvalidArgumentError(
        "--max_connections_per_client must be <= --max_connections");
  }
  return absl::OkStatus();
}

}  // namespace dedit