// Whether the client of an HTTP request handled by cpp-httplib is still
// connected, for a handler that answers with one body after a long wait
// (a non-streamed completion): the request is cancelled when the client
// went away, as a stream's failed write does for SSE.
//
// cpp-httplib 0.11 (Debian 12) gives a handler no access to its
// connection; later versions add Request::is_connection_closed for this.
// So the probe finds the connection's socket once, by its addresses: the
// handler runs while cpp-httplib holds the socket open, and a TCP
// connection is the only socket with that local and peer address pair.
//
//   ConnectionProbe probe(req);
//   while (waiting) { ... if (probe.ClientGone()) { cancel; break; } }
#ifndef DEDIT_GATEWAY_CONNECTION_PROBE_H_
#define DEDIT_GATEWAY_CONNECTION_PROBE_H_

#include <httplib.h>

namespace dedit {

class ConnectionProbe {
 public:
  explicit ConnectionProbe(const httplib::Request& req);

  // True once the peer has closed or reset the connection (a pipelined
  // next request is not a close). False when the socket was not found.
  bool ClientGone() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace dedit

#endif  // DEDIT_GATEWAY_CONNECTION_PROBE_H_
