// A Generate client for the service tests: streams one request to the end
// and collects its tokens, text, final message and status.
//
//   Generated g = Generate(stub.get(), IdsRequest(prompt, 16));
//   EXPECT_TRUE(g.status.ok());
#ifndef DEDIT_TESTS_SERVICES_STREAM_CLIENT_H_
#define DEDIT_TESTS_SERVICES_STREAM_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
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
  while (reader->Read(&response)) {
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

}  // namespace dedit::testing

#endif  // DEDIT_TESTS_SERVICES_STREAM_CLIENT_H_
