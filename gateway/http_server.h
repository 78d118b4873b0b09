// An HTTP/1.1 server whose limits hold against hostile clients: the
// listener, the connections, their limits and deadlines, in-order
// pipelining, and the writing of responses (one body, or a chunked stream
// such as SSE). What a request means is the handler's business
// (gateway/openai_server.cc).
//
// Why Boost.Beast + Boost.Asio (Debian's libboost-dev, header-only): every
// limit below is ours to set and to answer. A deadline covers the whole
// header and the whole body (one timer per connection around the parser's
// reads), not each read; the parser's header and body limits are explicit;
// and pipelined requests are parsed one after another from the bytes left
// in the connection's buffer. cpp-httplib (one thread per connection, a
// timeout per read) and libmicrohttpd (idle timeouts only) give none of
// these three. Connections are event-driven: a slow or idle one holds a
// socket and its buffer, never a thread.
//
//   HttpServer::Callbacks callbacks;
//   callbacks.handle = [](std::shared_ptr<HttpExchange> exchange) {
//     // On an io thread: answer at once, or hand blocking work to a pool.
//     HttpResponse response;
//     response.body = "{}";
//     exchange->Respond(std::move(response));
//   };
//   callbacks.refusal = [](int status, const std::string& message) { ... };
//   HttpServer server(options, callbacks);
//   absl::StatusOr<int> port = server.Start();
//   ...
//   server.CloseConnections();  // then finish the handlers' work
//   server.Stop();
//
// Refusals by the server itself, each with callbacks.refusal's body,
// `Connection: close`, and the connection closed after a short linger
// (the client's unread bytes are drained so that it reads the answer
// rather than a reset):
//   408 header or body not complete within its deadline (counted from the
//       accept or the first byte of a request, and from the end of the
//       header);
//   411 a POST with neither Content-Length nor chunked Transfer-Encoding;
//   413 a body over max_body_bytes: at once for a Content-Length, as soon
//       as a chunked body crosses it;
//   414 a request line over max_request_line_bytes;
//   431 a header section over max_header_bytes, or more than max_headers;
//   400 malformed framing (a bad Content-Length or chunk, both
//       Content-Length and Transfer-Encoding, ...);
//   429 / 503 more than max_connections_per_client / max_connections
//       open, answered at the accept without reading the request.
#ifndef DEDIT_GATEWAY_HTTP_SERVER_H_
#define DEDIT_GATEWAY_HTTP_SERVER_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dedit {

struct HttpLimits {
  int header_timeout_ms = 10000;  // the whole request line and header
  int body_timeout_ms = 30000;    // the whole body, from the header's end
  int keep_alive_timeout_s = 5;   // idle between requests
  int write_timeout_s = 30;       // each write to the client
  size_t max_request_line_bytes = 8192;
  size_t max_header_bytes = 16384;  // request line and fields together
  int max_headers = 100;
  size_t max_body_bytes = 1 << 20;
  int max_connections = 1024;
  int max_connections_per_client = 32;  // by client IP address
};

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0 = ephemeral
  // Threads that run every socket's I/O and the handlers' routing. They
  // never block (blocking work belongs to the handler's pools), so a few
  // serve any number of connections.
  int io_threads = 2;
  HttpLimits limits;
};

// INVALID_ARGUMENT naming the flag (--<field>) that is out of range.
absl::Status ValidateHttpServerOptions(const HttpServerOptions& options);

struct HttpRequest {
  std::string method;
  std::string target;  // as sent
  std::string path;    // the target up to '?'
  std::string body;
  std::string client_address;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // ignored by HttpExchange::StartStream
};

class HttpConnection;  // http_server.cc

// One request in flight and the way to answer it: Respond once, or
// StartStream, Write any number of times, and EndStream. The connection
// reads its next (pipelined) request only after the answer, so answers go
// out in request order.
//
// Respond, StartStream, Write and EndStream are for one thread at a time
// (the handler's); ClientGone is for any. StartStream and Write return once
// their bytes are written or queued, and wait while more than 64 KiB are
// queued (at most the write timeout, then the connection closes), so a slow
// reader slows its writer instead of filling memory. An exchange dropped
// without an answer answers 500, or ends its stream.
class HttpExchange {
 public:
  ~HttpExchange();
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  const HttpRequest& request() const { return request_; }

  void Respond(HttpResponse response);
  // False when the client is gone or a write failed or timed out (the
  // connection is then closed); EndStream is still due. Writing "" writes
  // nothing.
  bool StartStream(const HttpResponse& head);
  bool Write(const std::string& data);
  void EndStream();

  // True once the client closed or reset its connection, or a write to it
  // failed or timed out. A pipelined next request is not a close.
  bool ClientGone() const;

 private:
  friend class HttpConnection;
  HttpExchange(std::shared_ptr<HttpConnection> connection, HttpRequest request,
               bool chunked, bool close);

  const std::shared_ptr<HttpConnection> connection_;
  const HttpRequest request_;
  // False for an HTTP/1.0 client: its stream ends at the close.
  const bool chunked_;
  const bool close_;  // the connection closes after this answer
  enum class State { kNew, kStreaming, kDone };
  State state_ = State::kNew;
  int stream_status_ = 200;
};

class HttpServer {
 public:
  struct Callbacks {
    // A complete request, on an io thread. Must not block.
    std::function<void(std::shared_ptr<HttpExchange>)> handle;
    // The response of the server's own refusals (status and message).
    std::function<HttpResponse(int status, const std::string& message)> refusal;
    // After each response's last byte (or its failure): the request's path
    // ("" when it never parsed), the status, and the seconds from the
    // complete request, unknown for the server's refusals.
    std::function<void(const std::string& path, int status,
                       std::optional<double> seconds)>
        on_response;
  };

  HttpServer(HttpServerOptions options, Callbacks callbacks);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the io threads; the bound port.
  // UNAVAILABLE when the address cannot be bound.
  absl::StatusOr<int> Start();
  // Stops accepting and closes every connection (one writing an answer's
  // last bytes closes after them): pending and later writes fail,
  // ClientGone turns true. The io threads keep running, so handlers still
  // holding exchanges finish without blocking.
  void CloseConnections();
  // Gives answers being written up to a second, then stops and joins the
  // io threads.
  // REQUIRES: no handler still writes (its pools are joined).
  void Stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dedit

#endif  // DEDIT_GATEWAY_HTTP_SERVER_H_
