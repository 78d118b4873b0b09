// dedit.v1.Generation/Session: multi-turn sessions over one bidirectional
// stream (docs/SERVICES.md "Sessions", docs/ARCHITECTURE.md §8).
//
// The client sends `open` (model, sampling, speculation), then turns, one
// at a time; `cancel` ends the running turn, `close` (or half-closing the
// stream) ends the session. The router keeps the session's history (token
// ids, or chat messages with each answer's streamed text) and the id of
// the sequence its last turn kept on its stack: each turn is an ordinary
// RouterRequest over the whole history (so validation, the chat template,
// stop handling and speculation are Generate's), marked `keep` and
// continuing that sequence, so the target prefills only the tokens after
// the longest common prefix of what it caches and the new history.
//
// Bounds: --max_sessions open sessions per router (RESOURCE_EXHAUSTED at
// open), --max_session_turns turns per session (RESOURCE_EXHAUSTED), the
// history below the model's max context (INVALID_ARGUMENT, as a Generate
// prompt), every turn as a Generate request; a session idle (no turn
// running) for --session_idle_timeout_s ends with DEADLINE_EXCEEDED.
// Protocol errors (a turn before open, two opens, a turn while one runs)
// are FAILED_PRECONDITION. Any error ends the stream; a closed, broken or
// failed stream releases the kept sequence on the target and the drafter.
//
// Thread-safe.
#ifndef DEDIT_ROUTER_SESSION_SERVICE_H_
#define DEDIT_ROUTER_SESSION_SERVICE_H_

#include <grpcpp/grpcpp.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "dedit/v1/services.grpc.pb.h"
#include "router/request_builder.h"
#include "router/stack_set.h"

namespace dedit {

struct SessionOptions {
  int max_sessions = 256;  // open sessions per router
  int max_turns = 1000;    // turns per session
  // A session with no turn running for this long ends; 0 = never.
  int64_t idle_timeout_ms = 300000;
};

class SessionCore;

class SessionManager {
 public:
  // `limits` gives the current request limits (GenerationServiceImpl's);
  // `registry` may be null (no dedit_sessions_open gauge).
  SessionManager(StackSet* stacks, const Tokenizer* tokenizer,
                 SessionOptions options, std::function<RequestLimits()> limits,
                 prometheus::Registry* registry);
  ~SessionManager();  // stops the idle reaper

  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* Open(
      grpc::CallbackServerContext* context);

  int open_sessions() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class SessionCore;
  void Leave() ABSL_LOCKS_EXCLUDED(mu_);  // a session ended (OnDone)
  void ReapIdle() ABSL_LOCKS_EXCLUDED(mu_);

  StackSet* stacks_;
  const Tokenizer* tokenizer_;
  const SessionOptions options_;
  std::function<RequestLimits()> limits_;
  prometheus::Gauge* open_gauge_ = nullptr;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::weak_ptr<SessionCore>> sessions_ ABSL_GUARDED_BY(mu_);
  std::thread reaper_;
};

}  // namespace dedit

#endif  // DEDIT_ROUTER_SESSION_SERVICE_H_
