// A Generate client for the service tests: streams one request to the end
// and collects its tokens, text, final message and status.
//
//   Generated g = Generate(stub.get(), IdsRequest(prompt, 16));
//   EXPECT_TRUE(g.status.ok());
#ifndef DEDIT_TESTS_SERVICES_STREAM_CLIENT_H_
#define DEDIT_TESTS_SERVICES_STREAM_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dedit/v1/services.grpc.pb.h"

namespace dedit::testing {

struct Generated {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  v1::GenerateResponse last;  // the final message
  int messages = 0;
  // The longest wait between two messages (a stream that moved between
  // stacks stalls for the move).
  double max_gap_seconds = 0;
  // Sessions: the turn was refused (status holds why) and the session
  // stays open.
  bool turn_refused = false;
};

inline v1::GenerateRequest IdsRequest(const std::vector<int32_t>& prompt,
                                      int max_tokens, int window = 0,
                                      int passes = 0) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.set_window(window);
  r.set_passes(passes);
  return r;
}

// Streams one request to the end. `on_message` runs after every message.
inline Generated Generate(
    v1::Generation::Stub* stub, const v1::GenerateRequest& request,
    int timeout_s = 60,
    const std::function<void(const Generated&)>& on_message = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(timeout_s));
  Generated g;
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  auto previous = std::chrono::steady_clock::now();
  while (reader->Read(&response)) {
    const auto now = std::chrono::steady_clock::now();
    if (g.messages > 0) {
      g.max_gap_seconds =
          std::max(g.max_gap_seconds,
                   std::chrono::duration<double>(now - previous).count());
    }
    previous = now;
    ++g.messages;
    g.tokens.insert(g.tokens.end(), response.token_ids().begin(),
                    response.token_ids().end());
    g.text += response.text();
    if (response.finished()) g.last = response;
    if (on_message) on_message(g);
  }
  g.status = reader->Finish();
  return g;
}

// Requests streamed concurrently, one thread each; `started` counts those
// that have received a token. Join() waits for all of them.
//
//   ConcurrentStreams streams(stub, requests);
//   WaitFor([&] { return streams.started == n; }, 30000);
//   streams.Join();   // streams.results[i]
struct ConcurrentStreams {
  ConcurrentStreams(v1::Generation::Stub* stub,
                    const std::vector<v1::GenerateRequest>& requests,
                    int timeout_s = 120)
      : results(requests.size()) {
    for (size_t i = 0; i < requests.size(); ++i) {
      threads.emplace_back([this, stub, request = requests[i], timeout_s, i] {
        bool counted = false;
        results[i] =
            Generate(stub, request, timeout_s, [&](const Generated& g) {
              if (!counted && !g.tokens.empty()) {
                counted = true;
                ++started;
              }
            });
      });
    }
  }
  ~ConcurrentStreams() { Join(); }
  void Join() {
    for (std::thread& t : threads) {
      if (t.joinable()) t.join();
    }
  }

  std::vector<Generated> results;
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
};

// A Generation.Session client: open, turns read to their last message,
// cancel, close.
//
//   SessionClient session(stub);
//   ASSERT_TRUE(session.Open(open));
//   Generated t = session.Turn(TokensTurn(ids, 16));
//   EXPECT_TRUE(session.Close().ok());
class SessionClient {
 public:
  explicit SessionClient(v1::Generation::Stub* stub, int timeout_s = 120) {
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(timeout_s));
    stream_ = stub->Session(&context_);
  }
  ~SessionClient() {
    if (!finished_) {
      context_.TryCancel();
      v1::SessionResponse r;
      while (stream_->Read(&r)) {
      }
      stream_->Finish();
    }
  }

  bool Send(const v1::SessionRequest& request) {
    return stream_->Write(request);
  }
  bool Read(v1::SessionResponse* response) { return stream_->Read(response); }

  // Sends `open` and reads the answer.
  bool Open(const v1::SessionOpen& open, v1::SessionOpened* opened = nullptr) {
    v1::SessionRequest request;
    *request.mutable_open() = open;
    v1::SessionResponse response;
    if (!Send(request) || !Read(&response) || !response.has_opened()) {
      return false;
    }
    if (opened != nullptr) *opened = response.opened();
    return true;
  }

  // Sends the turn and reads its messages up to the finished one (empty
  // `last` and status set when the stream ended instead). `on_message`
  // runs after every message of the turn.
  Generated Turn(
      const v1::SessionTurn& turn,
      const std::function<void(const Generated&)>& on_message = nullptr) {
    v1::SessionRequest request;
    *request.mutable_turn() = turn;
    Generated g;
    if (!Send(request)) {
      g.status = Finish();
      return g;
    }
    return ReadTurn(on_message);
  }
  Generated ReadTurn(
      const std::function<void(const Generated&)>& on_message = nullptr) {
    Generated g;
    v1::SessionResponse response;
    while (Read(&response)) {
      ++g.messages;
      last_turn_ = response.turn();
      if (response.has_turn_error()) {
        g.status = grpc::Status(
            static_cast<grpc::StatusCode>(response.turn_error().code()),
            response.turn_error().message());
        g.turn_refused = true;
        return g;
      }
      const v1::GenerateResponse& r = response.response();
      g.tokens.insert(g.tokens.end(), r.token_ids().begin(),
                      r.token_ids().end());
      g.text += r.text();
      if (on_message) on_message(g);
      if (r.finished()) {
        g.last = r;
        return g;
      }
    }
    g.status = Finish();
    return g;
  }
  bool Cancel() {
    v1::SessionRequest request;
    request.mutable_cancel();
    return Send(request);
  }
  // Sends close, half-closes and reads to the end.
  grpc::Status Close() {
    v1::SessionRequest request;
    request.mutable_close();
    Send(request);
    stream_->WritesDone();
    v1::SessionResponse response;
    while (Read(&response)) {
    }
    return Finish();
  }
  grpc::Status Finish() {
    if (!finished_) {
      finished_ = true;
      status_ = stream_->Finish();
    }
    return status_;
  }
  int last_turn() const { return last_turn_; }
  grpc::ClientContext& context() { return context_; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>>
      stream_;
  bool finished_ = false;
  grpc::Status status_;
  int last_turn_ = 0;
};

inline v1::SessionTurn TokensTurn(const std::vector<int32_t>& ids,
                                  int max_tokens) {
  v1::SessionTurn t;
  t.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  t.set_max_tokens(max_tokens);
  return t;
}

// Polls `pred` every 25 ms until it holds or `timeout_ms` passed.
template <typename Pred>
bool WaitFor(Pred pred, int timeout_ms) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return pred();
}

// Whether the router behind `stub` serves now: it knows its target's
// model and, `with_drafter`, sees a healthy drafter. A router answers at
// once but learns both in the background, and until it knows the model
// it refuses generations UNAVAILABLE (a 503 at the OpenAI gateway).
inline bool RouterReady(v1::Generation::Stub* stub, bool with_drafter) {
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::RouterInfoResponse info;
  return stub->Info(&c, {}, &info).ok() && info.model().max_context() > 0 &&
         (!with_drafter || info.drafter_healthy());
}

// Waits up to `timeout_ms` until RouterReady.
inline bool WaitForRouterReady(v1::Generation::Stub* stub, bool with_drafter,
                               int timeout_ms) {
  return WaitFor([&] { return RouterReady(stub, with_drafter); }, timeout_ms);
}

}  // namespace dedit::testing

#endif  // DEDIT_TESTS_SERVICES_STREAM_CLIENT_H_
