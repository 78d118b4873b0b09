#include "router/session_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status.h"
#include "proto/grpc_status.h"

namespace dedit {

using Clock = std::chrono::steady_clock;
using SessionReactorBase =
    grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>;

// One session's state, shared by its reactor, its turns' sinks (held by a
// GenerationLoop, possibly after the stream ended) and the idle reaper.
// Decisions are made under mu_; the reactor, the stacks and the loops are
// called after releasing it (a refused Submit finishes the sink at once,
// on the calling thread).
class SessionCore : public std::enable_shared_from_this<SessionCore> {
 public:
  SessionCore(SessionManager* manager, SessionReactorBase* reactor,
              std::chrono::system_clock::time_point deadline)
      : manager_(manager), reactor_(reactor), deadline_(deadline) {
    std::random_device rd;
    id_ = absl::StrFormat("%016x", (static_cast<uint64_t>(rd()) << 32) | rd());
  }

  v1::SessionRequest* read_buffer() { return &read_; }
  // Gives the session's --max_sessions slot back, once: when its final
  // status is sent (so a client that saw its session end can open another
  // at once), or at OnDone for a stream that ended otherwise.
  void LeaveOnce() {
    if (!left_.exchange(true)) manager_->Leave();
  }
  void OnReadDone(bool ok);
  void OnWriteDone(bool ok);
  void OnCancel();  // the client went away (or its deadline passed)
  void OnDone();
  // Ends the session if it has been idle for `timeout` (the reaper).
  void ExpireIfIdle(Clock::time_point now, Clock::duration timeout);

  // From the turn's sink and TurnEnd, on a loop thread.
  void OnTurnMessage(int turn, v1::GenerateResponse response);
  void OnTurnFinished(int turn, const absl::Status& status);
  void OnTurnEnd(int turn, const TurnEnd& end);

 private:
  enum class Phase { kNew, kOpen, kClosing, kDone };
  enum class Mode { kUnset, kChat, kTokens };
  // What to do once mu_ is released.
  struct Actions {
    const v1::SessionResponse* write = nullptr;
    bool finish = false;
    grpc::Status status;
    bool read = false;
    std::shared_ptr<GenerationSink> cancel_turn;
    std::vector<std::pair<uint64_t, SequenceId>> release;
    std::optional<RouterRequest> submit;
  };
  class TurnSink;

  void Handle(Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleOpen(Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleTurn(Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<RouterRequest> BuildTurn(const v1::SessionTurn& turn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the stream with `status` after the queued writes; cancels the
  // running turn and releases the kept sequence.
  void EndLocked(const absl::Status& status, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseKeptLocked(Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running turn ended well: its input and answer join the history.
  void CompleteTurnLocked(Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueLocked(v1::SessionResponse response, Actions& actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishIfDueLocked(Actions& actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Perform(Actions& actions);

  SessionManager* const manager_;
  std::atomic<bool> left_{false};
  std::string id_;
  v1::SessionRequest read_;  // the reactor's read buffer (one read at a time)

  absl::Mutex mu_;
  SessionReactorBase* reactor_ ABSL_GUARDED_BY(mu_);  // null after OnDone
  const std::chrono::system_clock::time_point deadline_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kNew;
  v1::SessionOpen open_ ABSL_GUARDED_BY(mu_);
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kUnset;
  // The history: token ids (token sessions) or the conversation (chat).
  std::vector<int32_t> history_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ChatMessage> messages_ ABSL_GUARDED_BY(mu_);
  // The running turn: its sink, what its prompt adds to the history, and
  // the tokens and text streamed for it.
  int turns_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<GenerationSink> turn_sink_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> turn_prompt_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ChatMessage> turn_messages_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> turn_tokens_ ABSL_GUARDED_BY(mu_);
  std::string turn_text_ ABSL_GUARDED_BY(mu_);
  // The sequence the last turn kept (loop serial, engine id; 0 = none).
  uint64_t kept_loop_ ABSL_GUARDED_BY(mu_) = 0;
  SequenceId kept_id_ ABSL_GUARDED_BY(mu_) = 0;
  Clock::time_point idle_since_ ABSL_GUARDED_BY(mu_) = Clock::now();
  // Writes: the front is in flight while writing_.
  std::deque<v1::SessionResponse> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

// A turn's GenerationSink: forwards to the session, tagged with the turn.
class SessionCore::TurnSink : public GenerationSink {
 public:
  TurnSink(std::weak_ptr<SessionCore> core, int turn)
      : core_(std::move(core)), turn_(turn) {}
  void Send(v1::GenerateResponse response) override {
    if (auto core = core_.lock()) {
      core->OnTurnMessage(turn_, std::move(response));
    }
  }
  void Finish(const absl::Status& status) override {
    if (auto core = core_.lock()) core->OnTurnFinished(turn_, status);
  }

 private:
  std::weak_ptr<SessionCore> core_;
  const int turn_;
};

namespace {

class SessionReactor : public SessionReactorBase {
 public:
  SessionReactor(SessionManager* manager, grpc::CallbackServerContext* context)
      : core_(std::make_shared<SessionCore>(manager, this,
                                            context->deadline())) {}
  std::shared_ptr<SessionCore> core() { return core_; }
  void Begin() { StartRead(core_->read_buffer()); }
  void OnReadDone(bool ok) override { core_->OnReadDone(ok); }
  void OnWriteDone(bool ok) override { core_->OnWriteDone(ok); }
  void OnCancel() override { core_->OnCancel(); }
  void OnDone() override {
    core_->OnDone();
    delete this;
  }

 private:
  std::shared_ptr<SessionCore> core_;
};

// Merges a later message of the same turn into `back` (a slow client gets
// fewer, larger messages instead of an unbounded queue).
void MergeInto(v1::SessionResponse& back, const v1::SessionResponse& next) {
  v1::GenerateResponse* b = back.mutable_response();
  const v1::GenerateResponse& n = next.response();
  b->mutable_token_ids()->MergeFrom(n.token_ids());
  b->mutable_text()->append(n.text());
  if (n.finished()) {
    b->set_finished(true);
    b->set_finish_reason(n.finish_reason());
    *b->mutable_usage() = n.usage();
    *b->mutable_acceptance() = n.acceptance();
    b->set_stop_reason(n.stop_reason());
  }
}

}  // namespace

void SessionCore::Perform(Actions& a) {
  // Loops and stacks first (they never call back into a held lock), then
  // the reactor.
  if (a.cancel_turn != nullptr) manager_->stacks_->Cancel(a.cancel_turn);
  for (const auto& [loop, id] : a.release) {
    manager_->stacks_->ReleaseKept(loop, id);
  }
  if (a.submit.has_value()) manager_->stacks_->Submit(std::move(*a.submit));
  SessionReactorBase* reactor = nullptr;
  {
    absl::MutexLock lock(&mu_);
    reactor = reactor_;
    if (finished_) a.read = false;
  }
  if (reactor == nullptr) return;
  // The reactor stays alive until our own Finish: gRPC calls OnDone after.
  if (a.write != nullptr) reactor->StartWrite(a.write);
  if (a.read) reactor->StartRead(&read_);
  if (a.finish) {
    LeaveOnce();
    reactor->Finish(a.status);
  }
}

void SessionCore::QueueLocked(v1::SessionResponse response, Actions& a) {
  if (finish_requested_ || reactor_ == nullptr) return;
  if (queue_.size() >= 2 && queue_.back().turn() == response.turn() &&
      queue_.back().has_response() && response.has_response() &&
      !queue_.back().response().finished()) {
    MergeInto(queue_.back(), response);
    return;
  }
  queue_.push_back(std::move(response));
  if (writing_) return;
  writing_ = true;
  a.write = &queue_.front();
}

void SessionCore::FinishIfDueLocked(Actions& a) {
  if (finished_ || !finish_requested_ || writing_ || reactor_ == nullptr) {
    return;
  }
  finished_ = true;
  a.finish = true;
  a.status = final_status_;
}

void SessionCore::ReleaseKeptLocked(Actions& a) {
  if (kept_id_ != 0) a.release.emplace_back(kept_loop_, kept_id_);
  kept_id_ = 0;
}

void SessionCore::EndLocked(const absl::Status& status, Actions& a) {
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  a.cancel_turn = std::move(turn_sink_);
  ReleaseKeptLocked(a);
  if (!finish_requested_) {
    finish_requested_ = true;
    final_status_ = ToGrpcStatus(status);
  }
  FinishIfDueLocked(a);
}

void SessionCore::OnReadDone(bool ok) {
  Actions a;
  {
    absl::MutexLock lock(&mu_);
    if (!ok) {
      // Half-closed (or gone: OnCancel follows): a running turn may end.
      if (phase_ != Phase::kDone) {
        if (turn_sink_ == nullptr) {
          EndLocked(absl::OkStatus(), a);
        } else {
          phase_ = Phase::kClosing;
        }
      }
    } else if (phase_ != Phase::kDone && phase_ != Phase::kClosing) {
      Handle(a);
    }
  }
  Perform(a);
}

void SessionCore::Handle(Actions& a) {
  switch (read_.request_case()) {
    case v1::SessionRequest::kOpen:
      HandleOpen(a);
      return;
    case v1::SessionRequest::kTurn:
      HandleTurn(a);
      return;
    case v1::SessionRequest::kCancel:
      // Nothing running: nothing to cancel (it may just have ended).
      if (turn_sink_ != nullptr) a.cancel_turn = turn_sink_;
      a.read = true;
      return;
    case v1::SessionRequest::kClose:
      if (turn_sink_ == nullptr) {
        EndLocked(absl::OkStatus(), a);
      } else {
        phase_ = Phase::kClosing;
        a.cancel_turn = turn_sink_;
      }
      return;
    case v1::SessionRequest::REQUEST_NOT_SET:
      break;
  }
  EndLocked(absl::InvalidArgumentError(
                "session request is empty: send open, turn, cancel or close"),
            a);
}

void SessionCore::HandleOpen(Actions& a) {
  if (phase_ != Phase::kNew) {
    EndLocked(absl::FailedPreconditionError("session is already open"), a);
    return;
  }
  const RequestLimits limits = manager_->limits_();
  if (!limits.model.ready) {
    EndLocked(absl::UnavailableError("target service is not reachable"), a);
    return;
  }
  open_ = read_.open();
  // The settings are checked once, as a Generate request would be.
  v1::GenerateRequest probe;
  probe.set_model(open_.model());
  *probe.mutable_sampling() = open_.sampling();
  probe.set_window(open_.window());
  probe.set_passes(open_.passes());
  probe.set_speculative_method(open_.speculative_method());
  *probe.mutable_stop_token_ids() = open_.stop_token_ids();
  probe.mutable_token_ids()->add_ids(0);
  probe.set_max_tokens(1);
  absl::StatusOr<RouterRequest> checked =
      BuildRouterRequest(probe, limits, manager_->tokenizer_);
  if (!checked.ok()) {
    EndLocked(Annotate(checked.status(), "open"), a);
    return;
  }
  phase_ = Phase::kOpen;
  idle_since_ = Clock::now();
  v1::SessionResponse response;
  v1::SessionOpened* opened = response.mutable_opened();
  opened->set_session_id(id_);
  opened->set_max_context(limits.model.max_context);
  opened->set_max_turns(manager_->options_.max_turns);
  opened->set_idle_timeout_seconds(
      static_cast<double>(manager_->options_.idle_timeout_ms) / 1000.0);
  QueueLocked(std::move(response), a);
  a.read = true;
}

absl::StatusOr<RouterRequest> SessionCore::BuildTurn(
    const v1::SessionTurn& turn) {
  const RequestLimits limits = manager_->limits_();
  const Tokenizer* tokenizer = manager_->tokenizer_;
  v1::GenerateRequest g;
  g.set_model(open_.model());
  *g.mutable_sampling() = open_.sampling();
  g.set_window(open_.window());
  g.set_passes(open_.passes());
  g.set_disable_speculation(open_.disable_speculation());
  g.set_speculative_method(open_.speculative_method());
  g.set_ignore_eos(open_.ignore_eos());
  *g.mutable_stop_token_ids() = open_.stop_token_ids();
  g.set_max_tokens(turn.max_tokens());
  *g.mutable_stop() = turn.stop();
  turn_messages_.clear();
  turn_prompt_.clear();
  switch (turn.input_case()) {
    case v1::SessionTurn::kChat: {
      if (mode_ == Mode::kTokens) {
        return absl::InvalidArgumentError(
            "turn.chat: this is a token session (its first turn sent text or "
            "token_ids)");
      }
      if (turn.chat().messages().empty()) {
        return absl::InvalidArgumentError("turn.chat has no messages");
      }
      v1::ChatMessages* chat = g.mutable_chat();
      for (const v1::ChatMessage& m : messages_) *chat->add_messages() = m;
      for (const v1::ChatMessage& m : turn.chat().messages()) {
        *chat->add_messages() = m;
        turn_messages_.push_back(m);
      }
      chat->set_enable_thinking(open_.enable_thinking());
      break;
    }
    case v1::SessionTurn::kText:
    case v1::SessionTurn::kTokenIds: {
      if (mode_ == Mode::kChat) {
        return absl::InvalidArgumentError(
            "turn.text / turn.token_ids: this is a chat session (its first "
            "turn sent chat messages)");
      }
      // The new input alone, validated (and tokenized) as a prompt.
      v1::GenerateRequest input;
      if (turn.input_case() == v1::SessionTurn::kText) {
        input.set_text(turn.text());
      } else {
        *input.mutable_token_ids() = turn.token_ids();
      }
      input.set_max_tokens(1);
      absl::StatusOr<RouterRequest> built =
          BuildRouterRequest(input, limits, tokenizer);
      if (!built.ok()) {
        return Annotate(built.status(),
                        turn.input_case() == v1::SessionTurn::kText
                            ? "turn.text"
                            : "turn.token_ids");
      }
      v1::TokenIds* ids = g.mutable_token_ids();
      ids->mutable_ids()->Add(history_.begin(), history_.end());
      ids->mutable_ids()->Add(built->engine.prompt.begin(),
                              built->engine.prompt.end());
      break;
    }
    case v1::SessionTurn::INPUT_NOT_SET:
      return absl::InvalidArgumentError(
          "turn needs its input: text, chat or token_ids");
  }
  absl::StatusOr<RouterRequest> request =
      BuildRouterRequest(g, limits, tokenizer);
  if (!request.ok()) {
    return Annotate(request.status(),
                    absl::StrCat("session history with turn ", turns_ + 1));
  }
  if (turn.input_case() != v1::SessionTurn::kChat) {
    turn_prompt_ = request->engine.prompt;
  }
  return request;
}

void SessionCore::HandleTurn(Actions& a) {
  if (phase_ == Phase::kNew) {
    EndLocked(absl::FailedPreconditionError(
                  "session is not open: send open before the first turn"),
              a);
    return;
  }
  if (turn_sink_ != nullptr) {
    EndLocked(absl::FailedPreconditionError(absl::StrCat(
                  "turn ", turns_,
                  " is still running: wait for its last message or send "
                  "cancel")),
              a);
    return;
  }
  if (turns_ >= manager_->options_.max_turns) {
    EndLocked(absl::ResourceExhaustedError(absl::StrCat(
                  "session has had its ", manager_->options_.max_turns,
                  " turns (--max_session_turns)")),
              a);
    return;
  }
  absl::StatusOr<RouterRequest> request = BuildTurn(read_.turn());
  if (!request.ok()) {
    if (!absl::IsInvalidArgument(request.status())) {
      EndLocked(request.status(), a);
      return;
    }
    // A bad turn fails alone: the client may fix it and go on with the
    // history (and the cache) it has.
    turn_messages_.clear();
    turn_prompt_.clear();
    idle_since_ = Clock::now();
    v1::SessionResponse refused;
    refused.set_turn(turns_ + 1);
    refused.mutable_turn_error()->set_code(
        static_cast<int>(request.status().code()));
    refused.mutable_turn_error()->set_message(
        std::string(request.status().message()));
    QueueLocked(std::move(refused), a);
    a.read = true;
    return;
  }
  if (mode_ == Mode::kUnset) {
    mode_ = read_.turn().input_case() == v1::SessionTurn::kChat ? Mode::kChat
                                                                : Mode::kTokens;
  }
  const int turn = ++turns_;
  turn_tokens_.clear();
  turn_text_.clear();
  turn_sink_ = std::make_shared<TurnSink>(weak_from_this(), turn);
  request->arrival = std::chrono::steady_clock::now();
  request->deadline = deadline_;
  request->sink = turn_sink_;
  request->session_turn = true;
  request->engine.keep = true;
  request->engine.continue_sequence = kept_id_;
  request->pinned_loop = kept_loop_;
  // Strong: a turn that outlives its stream must still release what it
  // kept (the loop drops the request, and this reference, once it ended).
  request->on_turn_end = [core = shared_from_this(), turn](const TurnEnd& end) {
    core->OnTurnEnd(turn, end);
  };
  a.submit = std::move(*request);
  a.read = true;
}

void SessionCore::OnTurnMessage(int turn, v1::GenerateResponse response) {
  Actions a;
  {
    absl::MutexLock lock(&mu_);
    if (turn != turns_ || phase_ == Phase::kDone) return;
    turn_tokens_.insert(turn_tokens_.end(), response.token_ids().begin(),
                        response.token_ids().end());
    turn_text_ += response.text();
    const bool finished = response.finished();
    v1::SessionResponse out;
    out.set_turn(turn);
    *out.mutable_response() = std::move(response);
    QueueLocked(std::move(out), a);
    // The turn is over for the client once its last message is queued: it
    // may send the next turn before the loop finishes this sink.
    if (finished) CompleteTurnLocked(a);
  }
  Perform(a);
}

void SessionCore::CompleteTurnLocked(Actions& a) {
  if (turn_sink_ == nullptr) return;
  turn_sink_.reset();
  idle_since_ = Clock::now();
  // The history now holds the turn and its answer as streamed.
  if (mode_ == Mode::kChat) {
    for (v1::ChatMessage& m : turn_messages_) messages_.push_back(std::move(m));
    v1::ChatMessage answer;
    answer.set_role("assistant");
    answer.set_content(turn_text_);
    messages_.push_back(std::move(answer));
  } else {
    history_ = std::move(turn_prompt_);
    history_.insert(history_.end(), turn_tokens_.begin(), turn_tokens_.end());
  }
  turn_messages_.clear();
  turn_prompt_.clear();
  if (phase_ == Phase::kClosing) EndLocked(absl::OkStatus(), a);
}

void SessionCore::OnTurnEnd(int turn, const TurnEnd& end) {
  Actions a;
  {
    absl::MutexLock lock(&mu_);
    if (turn != turns_) return;
    // Whatever was kept before was taken over by this turn (or released).
    kept_loop_ = end.loop;
    kept_id_ = end.kept;
    // Nobody will continue it once the session is over.
    if (phase_ == Phase::kDone) ReleaseKeptLocked(a);
  }
  Perform(a);
}

void SessionCore::OnTurnFinished(int turn, const absl::Status& status) {
  Actions a;
  {
    absl::MutexLock lock(&mu_);
    if (turn != turns_ || turn_sink_ == nullptr) return;  // completed
    if (phase_ == Phase::kDone) {
      turn_sink_.reset();
    } else if (!status.ok()) {
      turn_sink_.reset();
      EndLocked(status, a);
    } else {
      CompleteTurnLocked(a);
    }
  }
  Perform(a);
}

void SessionCore::OnWriteDone(bool ok) {
  Actions a;
  {
    absl::MutexLock lock(&mu_);
    if (!queue_.empty()) queue_.pop_front();
    if (!ok) queue_.clear();  // the client is gone; OnCancel follows
    if (!queue_.empty() && reactor_ != nullptr) {
      a.write = &queue_.front();
    } else {
      writing_ = false;
      FinishIfDueLocked(a);
    }
  }
  Perform(a);
}

void SessionCore::OnCancel() {
  Actions a;
  {
    absl::MutexLock lock(&mu_);
    // A write in flight completes with ok = false, then it finishes.
    EndLocked(absl::CancelledError("client cancelled the session"), a);
  }
  Perform(a);
}

void SessionCore::OnDone() {
  Actions a;
  {
    absl::MutexLock lock(&mu_);
    EndLocked(absl::CancelledError("session stream ended"), a);
    reactor_ = nullptr;
    a.finish = false;
    a.write = nullptr;
  }
  Perform(a);
  LeaveOnce();
}

void SessionCore::ExpireIfIdle(Clock::time_point now, Clock::duration timeout) {
  Actions a;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kDone || turn_sink_ != nullptr ||
        now - idle_since_ < timeout) {
      return;
    }
    EndLocked(absl::DeadlineExceededError(absl::StrCat(
                  "session idle for more than ",
                  std::chrono::duration<double>(timeout).count(),
                  " s (--session_idle_timeout_s); its cache was released")),
              a);
  }
  Perform(a);
}

// ---------------------------------------------------------------------------
// SessionManager

SessionManager::SessionManager(StackSet* stacks, const Tokenizer* tokenizer,
                               SessionOptions options,
                               std::function<RequestLimits()> limits,
                               prometheus::Registry* registry)
    : stacks_(stacks),
      tokenizer_(tokenizer),
      options_(options),
      limits_(std::move(limits)) {
  if (registry != nullptr) {
    open_gauge_ = &prometheus::BuildGauge()
                       .Name("dedit_sessions_open")
                       .Help("Generation.Session streams open")
                       .Register(*registry)
                       .Add({});
  }
  if (options_.idle_timeout_ms > 0) {
    reaper_ = std::thread([this] { ReapIdle(); });
  }
}

SessionManager::~SessionManager() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
}

int SessionManager::open_sessions() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>*
SessionManager::Open(grpc::CallbackServerContext* context) {
  auto* reactor = new SessionReactor(this, context);
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    ++open_;  // Leave() runs once: at the final status, or at OnDone
    if (open_ > options_.max_sessions) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("too many sessions: ", options_.max_sessions,
                       " are open on this router (--max_sessions)"));
    } else {
      sessions_.push_back(reactor->core());
      // Forget sessions that ended.
      for (auto it = sessions_.begin(); it != sessions_.end();) {
        it = it->expired() ? sessions_.erase(it) : it + 1;
      }
    }
    if (open_gauge_ != nullptr) open_gauge_->Set(open_);
  }
  if (!refused.ok()) {
    reactor->core()->LeaveOnce();
    reactor->Finish(ToGrpcStatus(refused));
    return reactor;
  }
  reactor->Begin();
  return reactor;
}

void SessionManager::Leave() {
  absl::MutexLock lock(&mu_);
  --open_;
  if (open_gauge_ != nullptr) open_gauge_->Set(open_);
}

void SessionManager::ReapIdle() {
  const auto timeout = std::chrono::milliseconds(options_.idle_timeout_ms);
  // Checked often enough that a session ends within ~10% past its timeout.
  const absl::Duration period = absl::Milliseconds(
      std::clamp<int64_t>(options_.idle_timeout_ms / 10, 10, 1000));
  while (true) {
    std::vector<std::shared_ptr<SessionCore>> sessions;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), period)) return;
      for (const auto& weak : sessions_) {
        if (auto core = weak.lock()) sessions.push_back(std::move(core));
      }
    }
    const Clock::time_point now = Clock::now();
    for (const auto& core : sessions) core->ExpireIfIdle(now, timeout);
  }
}

}  // namespace dedit
