#include "gateway/http_connection.h"

#include <sys/socket.h>

#include <cerrno>
#include <iterator>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace dedit {

using Clock = std::chrono::steady_clock;

namespace {

// Bytes asked of the socket per read. A connection's buffer holds at most
// the header limit plus two of these (a header, and the next pipelined
// bytes read with it).
constexpr size_t kReadBytes = 16384;
// After a refusal, the client's unread input is drained for this long (or
// this many bytes) before the close: closing a socket with unread input
// sends a reset, which can destroy the answer before the client reads it.
constexpr auto kLinger = std::chrono::seconds(2);
constexpr size_t kLingerBytes = 8 << 20;
// A streaming writer waits while more than this is queued for its client.
constexpr size_t kOutboxBytes = 64 << 10;

// "METHOD SP target SP HTTP/1.1", without its CRLF.
size_t RequestLineBytes(const http::request<http::string_body>& message) {
  return message.method_string().size() + message.target().size() + 10;
}

std::string PathOf(beast::string_view target) {
  const size_t query = target.find('?');
  return std::string(
      query == beast::string_view::npos ? target : target.substr(0, query));
}

// The status line and fields. `content_length` unset: a stream, chunked
// (`chunked`) or ending at the close.
std::string FormatHead(const HttpResponse& response,
                       std::optional<size_t> content_length, bool chunked,
                       bool close) {
  const beast::string_view reason =
      http::obsolete_reason(static_cast<http::status>(response.status));
  std::string out =
      absl::StrCat("HTTP/1.1 ", response.status, " ",
                   absl::string_view(reason.data(), reason.size()),
                   "\r\nContent-Type: ", response.content_type, "\r\n");
  for (const auto& [name, value] : response.headers) {
    absl::StrAppend(&out, name, ": ", value, "\r\n");
  }
  if (content_length) {
    absl::StrAppend(&out, "Content-Length: ", *content_length, "\r\n");
  } else if (chunked) {
    out += "Transfer-Encoding: chunked\r\n";
  }
  if (close) out += "Connection: close\r\n";
  out += "\r\n";
  return out;
}

std::string FormatResponse(const HttpResponse& response, bool close) {
  return FormatHead(response, response.body.size(), false, close) +
         response.body;
}

}  // namespace

HttpConnection::HttpConnection(tcp::socket socket, ServerCore* core,
                               std::string client, bool counted)
    : socket_(std::move(socket)),
      deadline_(socket_.get_executor()),
      core_(core),
      client_(std::move(client)),
      counted_(counted),
      buffer_(core->limits.max_header_bytes + 2 * kReadBytes),
      fd_(socket_.native_handle()) {}

HttpConnection::~HttpConnection() {
  core_->table.Untrack(this);
  ReleaseCount();
}

void HttpConnection::Arm(Clock::duration timeout) {
  const uint64_t tick = ++deadline_tick_;
  deadline_hit_ = false;
  deadline_.expires_after(timeout);
  deadline_.async_wait([self = shared_from_this(), tick](beast::error_code ec) {
    if (ec || tick != self->deadline_tick_) return;
    self->deadline_hit_ = true;
    beast::error_code ignored;
    self->socket_.cancel(ignored);  // the pending operation fails
  });
}

void HttpConnection::Disarm() {
  ++deadline_tick_;
  deadline_.cancel();
}

void HttpConnection::ReadRequest() {
  if (core_->closing) return CloseNow();
  const HttpLimits& limits = core_->limits;
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
  parser_->body_limit(limits.max_body_bytes);
  path_.clear();
  if (served_any_ && buffer_.size() == 0) return WaitIdle();
  // The first request's deadline counts from the accept, a later one's
  // from its first byte.
  phase_ = Phase::kHeader;
  Arm(std::chrono::milliseconds(limits.header_timeout_ms));
  http::async_read_header(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) {
        self->OnHeader(ec);
      });
}

void HttpConnection::WaitIdle() {
  phase_ = Phase::kIdle;
  Arm(std::chrono::seconds(core_->limits.keep_alive_timeout_s));
  socket_.async_read_some(
      buffer_.prepare(kReadBytes),
      [self = shared_from_this()](beast::error_code ec, size_t n) {
        self->buffer_.commit(n);
        // Idle past the keep-alive, or closed by the client: nobody waits
        // for an answer.
        if (ec) return self->CloseNow();
        self->ReadRequest();
      });
}

void HttpConnection::OnHeader(beast::error_code ec) {
  if (ec) return OnReadError(ec);
  const HttpLimits& limits = core_->limits;
  const auto& message = parser_->get();
  path_ = PathOf(message.target());
  // A request line under the header limit may still be over its own.
  if (RequestLineBytes(message) > limits.max_request_line_bytes) {
    return Refuse(414, absl::StrCat("the request line exceeds ",
                                    limits.max_request_line_bytes, " bytes"));
  }
  if (std::distance(message.begin(), message.end()) > limits.max_headers) {
    return Refuse(
        431, absl::StrCat("more than ", limits.max_headers, " header fields"));
  }
  if (message.count(http::field::transfer_encoding) > 0 &&
      !parser_->chunked()) {
    return Refuse(400, "only the chunked Transfer-Encoding is supported");
  }
  const http::verb method = message.method();
  if (!parser_->content_length() && !parser_->chunked() &&
      (method == http::verb::post || method == http::verb::put ||
       method == http::verb::patch)) {
    return Refuse(411,
                  "a request body needs Content-Length or chunked "
                  "Transfer-Encoding");
  }
  if (parser_->is_done()) return Dispatch();
  if (!beast::iequals(message[http::field::expect], "100-continue")) {
    return ReadBody();
  }
  // The client waits for this before it sends the body (curl does for
  // larger bodies); refusals above went out instead of it.
  static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
  Arm(std::chrono::seconds(limits.write_timeout_s));
  net::async_write(socket_, net::buffer(kContinue),
                   [self = shared_from_this()](beast::error_code ec, size_t) {
                     self->Disarm();
                     if (ec) return self->CloseNow();
                     self->ReadBody();
                   });
}

void HttpConnection::ReadBody() {
  phase_ = Phase::kBody;
  Arm(std::chrono::milliseconds(core_->limits.body_timeout_ms));
  http::async_read(socket_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) {
                     if (ec) return self->OnReadError(ec);
                     self->Dispatch();
                   });
}

bool HttpConnection::RequestLineOverLimit() const {
  const size_t limit = core_->limits.max_request_line_bytes;
  // Beast consumes the request line as soon as it is complete (the fields
  // stay in the buffer until the whole header is): either it was parsed, or
  // it is the start of the buffer.
  const auto& message = parser_->get();
  if (!message.target().empty()) return RequestLineBytes(message) > limit;
  const std::string_view bytes(static_cast<const char*>(buffer_.data().data()),
                               buffer_.size());
  const size_t eol = bytes.find("\r\n");
  return eol == std::string_view::npos ? bytes.size() > limit : eol > limit;
}

void HttpConnection::OnReadError(beast::error_code ec) {
  const HttpLimits& limits = core_->limits;
  const bool header = phase_ == Phase::kHeader;
  if (ec == net::error::operation_aborted && deadline_hit_) {
    return Refuse(
        408, header ? absl::StrCat("the request header did not arrive within ",
                                   limits.header_timeout_ms, " ms")
                    : absl::StrCat("the request body did not arrive within ",
                                   limits.body_timeout_ms, " ms"));
  }
  if (ec == http::error::header_limit) {
    // Beast reports one limit for the whole header; the request line has
    // its own status.
    if (RequestLineOverLimit()) {
      return Refuse(414, absl::StrCat("the request line exceeds ",
                                      limits.max_request_line_bytes, " bytes"));
    }
    return Refuse(431, absl::StrCat("the request header exceeds ",
                                    limits.max_header_bytes, " bytes"));
  }
  if (ec == http::error::body_limit) {
    return Refuse(413, absl::StrCat("the request body exceeds ",
                                    limits.max_body_bytes, " bytes"));
  }
  if (ec == http::error::buffer_overflow) {
    return Refuse(header ? 431 : 400, header ? "the request header is too long"
                                             : "a chunk header is too long");
  }
  const bool parse_error =
      ec.category() ==
      http::make_error_code(http::error::bad_method).category();
  if (parse_error && ec != http::error::end_of_stream &&
      ec != http::error::partial_message) {
    return Refuse(400, absl::StrCat("malformed HTTP request: ", ec.message()));
  }
  // The client closed or reset the connection: nobody to answer.
  CloseNow();
}

void HttpConnection::Dispatch() {
  Disarm();
  http::request<http::string_body> message = parser_->release();
  parser_.reset();
  HttpRequest request;
  request.method = std::string(message.method_string());
  request.target = std::string(message.target());
  request.path = path_;
  request.body = std::move(message.body());
  request.client_address = client_;
  // HTTP/1.0 connections close after each answer (a stream there ends at
  // the close); so does a HEAD's, whose answer (no route serves HEAD)
  // carries a body.
  const bool close = !message.keep_alive() || message.version() < 11 ||
                     message.method() == http::verb::head;
  served_any_ = true;
  request_start_ = Clock::now();
  phase_ = Phase::kHandling;
  WatchPeer();
  std::shared_ptr<HttpExchange> exchange(new HttpExchange(
      shared_from_this(), std::move(request), message.version() >= 11, close));
  core_->callbacks.handle(std::move(exchange));
}

// While a handler works, the socket is watched for the client's close, so
// a long wait (a non-streamed completion) can be cancelled. Nothing is
// read: a pipelined next request stays in the socket until its turn.
void HttpConnection::WatchPeer() {
  socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](
                                                 beast::error_code ec) {
    if (ec == net::error::operation_aborted) return;
    if (self->phase_ != Phase::kHandling) return;
    if (!ec) {
      char byte;
      const ssize_t n = ::recv(self->socket_.native_handle(), &byte, 1,
                               MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) return;  // a pipelined request, not a close
      if (n < 0 &&
          (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        return self->WatchPeer();
      }
    }
    self->peer_gone_ = true;
  });
}

bool HttpConnection::SendPart(absl::string_view bytes) {
  absl::MutexLock lock(&out_mu_);
  if (out_closed_ || peer_gone_) return false;
  if (outbox_.empty() && !flushing_) {
    const ssize_t n =
        ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      peer_gone_ = true;  // reset: the answer's end closes the connection
      return false;
    }
    if (n > 0) bytes.remove_prefix(static_cast<size_t>(n));
    if (bytes.empty()) return true;
  }
  outbox_.append(bytes.data(), bytes.size());
  if (!flushing_) {
    flushing_ = true;
    net::post(executor(), [self = shared_from_this()] { self->Flush(); });
  }
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_mu_) {
    return out_closed_ || outbox_.size() <= kOutboxBytes;
  };
  out_mu_.Await(absl::Condition(&room));
  return !out_closed_;
}

void HttpConnection::AwaitSent() {
  absl::MutexLock lock(&out_mu_);
  auto sent = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_mu_) {
    return out_closed_ || !flushing_;
  };
  out_mu_.Await(absl::Condition(&sent));
}

void HttpConnection::Flush() {
  {
    absl::MutexLock lock(&out_mu_);
    if (out_closed_ || outbox_.empty()) {
      flushing_ = false;
      return;
    }
    writing_.clear();
    writing_.swap(outbox_);
  }
  Arm(std::chrono::seconds(core_->limits.write_timeout_s));
  net::async_write(socket_, net::buffer(writing_),
                   [self = shared_from_this()](beast::error_code ec, size_t) {
                     self->Disarm();
                     // A slow reader past the deadline, or a reset: the
                     // stream is over.
                     if (ec) return self->CloseNow();
                     self->Flush();
                   });
}

void HttpConnection::PostFinal(std::string bytes, int status, bool close) {
  net::post(executor(),
            [self = shared_from_this(),
             bytes = std::make_shared<std::string>(std::move(bytes)), status,
             close] { self->SendFinal(bytes, status, close, false); });
}

void HttpConnection::Refuse(int status, const std::string& message) {
  Disarm();
  const HttpResponse response = core_->callbacks.refusal(status, message);
  SendFinal(std::make_shared<std::string>(FormatResponse(response, true)),
            status, /*close=*/true, /*refusal=*/true);
}

void HttpConnection::SendFinal(std::shared_ptr<std::string> bytes, int status,
                               bool close, bool refusal) {
  std::optional<double> seconds;
  if (!refusal) {
    seconds =
        std::chrono::duration<double>(Clock::now() - request_start_).count();
  }
  auto record = [this, status, seconds] {
    if (core_->callbacks.on_response) {
      core_->callbacks.on_response(path_, status, seconds);
    }
  };
  // A client that only half-closed (sent its request, then shut down its
  // side) still gets the answer; ClientGone already told the handler.
  if (phase_ == Phase::kClosed) {
    record();
    return;
  }
  phase_ = Phase::kAnswering;
  beast::error_code ignored;
  socket_.cancel(ignored);  // ends the peer watch: the next read is ours
  Arm(std::chrono::seconds(core_->limits.write_timeout_s));
  net::async_write(socket_, net::buffer(*bytes),
                   [self = shared_from_this(), bytes, close, record](
                       beast::error_code ec, size_t) {
                     self->Disarm();
                     record();
                     if (ec) return self->CloseNow();
                     if (close || self->peer_gone_) return self->Linger();
                     self->ReadRequest();
                   });
}

void HttpConnection::Linger() {
  beast::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  if (core_->lingering.fetch_add(1) >= core_->limits.max_connections) {
    core_->lingering.fetch_sub(1);
    return CloseNow();  // a flood of refusals must not pile up sockets
  }
  phase_ = Phase::kLinger;
  parser_.reset();
  buffer_.clear();
  lingered_ = 0;
  Arm(kLinger);
  Discard();
}

void HttpConnection::Discard() {
  socket_.async_read_some(
      buffer_.prepare(kReadBytes),
      [self = shared_from_this()](beast::error_code ec, size_t n) {
        self->lingered_ += n;  // never committed: the same bytes reused
        if (ec || self->lingered_ > kLingerBytes) return self->CloseNow();
        self->Discard();
      });
}

void HttpConnection::CloseNow() {
  if (phase_ == Phase::kClosed) return;
  if (phase_ == Phase::kLinger) core_->lingering.fetch_sub(1);
  phase_ = Phase::kClosed;
  peer_gone_ = true;
  closed_ = true;
  Disarm();
  {
    absl::MutexLock lock(&out_mu_);  // no direct write is using the socket
    out_closed_ = true;
    outbox_.clear();
  }
  beast::error_code ignored;
  socket_.close(ignored);
  parser_.reset();
  buffer_.clear();
  buffer_.shrink_to_fit();
  ReleaseCount();
}

HttpExchange::HttpExchange(std::shared_ptr<HttpConnection> connection,
                           HttpRequest request, bool chunked, bool close)
    : connection_(std::move(connection)),
      request_(std::move(request)),
      chunked_(chunked),
      close_(close) {}

HttpExchange::~HttpExchange() {
  if (state_ == State::kNew) {
    Respond(
        connection_->callbacks().refusal(500, "the server sent no response"));
  } else if (state_ == State::kStreaming) {
    EndStream();
  }
}

void HttpExchange::Respond(HttpResponse response) {
  if (state_ != State::kNew) return;
  state_ = State::kDone;
  connection_->PostFinal(FormatResponse(response, close_), response.status,
                         close_);
}

bool HttpExchange::StartStream(const HttpResponse& head) {
  if (state_ != State::kNew) return false;
  state_ = State::kStreaming;
  stream_status_ = head.status;
  return connection_->SendPart(
      FormatHead(head, std::nullopt, chunked_, close_ || !chunked_));
}

bool HttpExchange::Write(const std::string& data) {
  if (state_ != State::kStreaming) return false;
  if (data.empty()) return !ClientGone();  // an empty chunk would end it
  if (!chunked_) return connection_->SendPart(data);
  return connection_->SendPart(
      absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n"));
}

void HttpExchange::EndStream() {
  if (state_ != State::kStreaming) return;
  state_ = State::kDone;
  connection_->AwaitSent();  // the last chunk goes after every part
  connection_->PostFinal(chunked_ ? "0\r\n\r\n" : "", stream_status_,
                         close_ || !chunked_);
}

bool HttpExchange::ClientGone() const { return connection_->peer_gone(); }

}  // namespace dedit
