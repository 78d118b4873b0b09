// One client connection of the HTTP server (http_server.h), internal to
// it: reads requests under the limits and deadlines, hands each complete
// one to the handler as an HttpExchange, writes the answers, and refuses
// what breaks a limit. HttpExchange (declared in http_server.h) is
// implemented here, over it.
#ifndef DEDIT_GATEWAY_HTTP_CONNECTION_H_
#define DEDIT_GATEWAY_HTTP_CONNECTION_H_

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "gateway/connection_table.h"
#include "gateway/http_server.h"

namespace dedit {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// What every connection shares with its server.
struct ServerCore {
  ServerCore(const HttpLimits& l, HttpServer::Callbacks c)
      : limits(l),
        callbacks(std::move(c)),
        table(l.max_connections, l.max_connections_per_client) {}
  const HttpLimits limits;
  const HttpServer::Callbacks callbacks;
  ConnectionTable table;
  std::atomic<bool> closing{false};
  // Connections draining input after their answer (HttpConnection::Linger).
  // They are not counted as open, so this bounds them instead: past
  // max_connections, a refused connection closes at once.
  std::atomic<int> lingering{0};
};

// One client connection. Everything but the marked entry points runs on
// the connection's strand (its socket's executor), so its state needs no
// lock. Deadlines are one timer that cancels the pending socket operation:
// Beast's tcp_stream closes the socket when its deadline fires, which
// would leave no way to answer 408.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(tcp::socket socket, ServerCore* core, std::string client,
                 bool counted);
  ~HttpConnection();

  net::any_io_executor executor() { return socket_.get_executor(); }

  // On the strand.
  void Start() { ReadRequest(); }
  void Refuse(int status, const std::string& message);
  void CloseNow();
  // At shutdown: closes now, unless an answer's last bytes are being
  // written (a drained stream's end), which then close it.
  void Shutdown() {
    if (phase_ != Phase::kAnswering) CloseNow();
  }

  // Any thread (HttpExchange).
  // An answer's last bytes (all of a single-body answer); then the next
  // request, or the close.
  void PostFinal(std::string bytes, int status, bool close);
  // A part of a streamed answer. Returns once the bytes are written or
  // queued; waits while more than 64 KiB are queued for a slow reader (at
  // most the write deadline, after which the connection closes). False once
  // the client is gone or the connection closed.
  bool SendPart(absl::string_view bytes);
  // Waits until the queued parts are written or the connection closed.
  void AwaitSent();
  bool peer_gone() const { return peer_gone_.load(); }
  bool closed() const { return closed_.load(); }
  const HttpServer::Callbacks& callbacks() const { return core_->callbacks; }

 private:
  enum class Phase {
    kIdle,       // between requests, waiting for the next one's first byte
    kHeader,     // reading a request line and header
    kBody,       // reading a body
    kHandling,   // the handler has the request; its answer may be streaming
    kAnswering,  // writing an answer's last bytes
    kLinger,     // after a refusal, draining input before the close
    kClosed,
  };

  void ReadRequest();
  void WaitIdle();
  void OnHeader(beast::error_code ec);
  void ReadBody();
  void OnReadError(beast::error_code ec);
  void Dispatch();
  void WatchPeer();
  void Flush();
  void SendFinal(std::shared_ptr<std::string> bytes, int status, bool close,
                 bool refusal);
  void Linger();
  void Discard();
  void Arm(std::chrono::steady_clock::duration timeout);
  void Disarm();
  bool RequestLineOverLimit() const;
  void ReleaseCount() {
    if (std::exchange(counted_, false)) core_->table.Release(client_);
  }

  tcp::socket socket_;
  net::steady_timer deadline_;
  ServerCore* const core_;
  const std::string client_;
  bool counted_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::kHeader;
  uint64_t deadline_tick_ = 0;
  bool deadline_hit_ = false;
  bool served_any_ = false;
  std::string path_;  // of the request being read or answered
  std::chrono::steady_clock::time_point request_start_;
  size_t lingered_ = 0;
  std::atomic<bool> peer_gone_{false};
  std::atomic<bool> closed_{false};

  // A stream's parts go from the handler's thread straight to the socket
  // while nothing is queued, as a thread-per-connection server writes,
  // instead of waking an io thread per token; what the socket does not take
  // is queued and written by the strand (Flush). The lock also keeps the
  // socket open during such a write.
  const int fd_;
  absl::Mutex out_mu_;
  std::string outbox_ ABSL_GUARDED_BY(out_mu_);
  bool flushing_ ABSL_GUARDED_BY(out_mu_) = false;  // a Flush is due or writing
  bool out_closed_ ABSL_GUARDED_BY(out_mu_) = false;
  std::string writing_;  // on the strand: the queued bytes being written
};

}  // namespace dedit

#endif  // DEDIT_GATEWAY_HTTP_CONNECTION_H_
