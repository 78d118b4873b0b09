// common/serving/round_stream.h: rounds on one long-lived stream, with a fake
// Target.Rounds whose "model thread" answers each round after a delay.
// A round's verify item says what to do: start = delay in ms, block[0] =
// the status code to answer with; the answer echoes start as `accepted`.
#include "common/serving/round_stream.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/serving/server_bootstrap.h"
#include "dedit/v1/services.grpc.pb.h"
#include "gtest/gtest.h"

namespace dedit {
namespace {

using Clock = std::chrono::system_clock;
using Client = RoundStreamClient<v1::StepRequest, v1::StepResponse>;

class FakeTarget final : public v1::Target::CallbackService {
 public:
  ~FakeTarget() override {
    absl::MutexLock lock(&mu_);
    for (std::thread& t : threads_) t.join();
  }

  grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>* Rounds(
      grpc::CallbackServerContext*) override {
    opened_.fetch_add(1);
    return new RoundStreamReactor<v1::StepRequest, v1::StepResponse>(
        &streams(),
        [this](const v1::StepRequest& request, v1::StepResponse* response,
               std::function<void(absl::Status)> done) {
          const v1::VerifyItem& item = request.verify().items(0);
          const int delay_ms = static_cast<int>(item.start());
          const int code = item.block(0);
          absl::MutexLock lock(&mu_);
          threads_.emplace_back([=] {
            std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
            response->mutable_verify()->add_results()->set_accepted(delay_ms);
            done(code == 0 ? absl::OkStatus()
                           : absl::Status(static_cast<absl::StatusCode>(code),
                                          absl::StrCat("round failed ", code)));
          });
        });
  }

  RoundStreams& streams() {
    absl::MutexLock lock(&mu_);
    return *streams_.back();
  }
  // Ends the open streams as a drain does, but takes new ones (a service
  // that closed its streams between two rounds, e.g. a new instance
  // behind the same address).
  void EndStreams() {
    RoundStreams& old = streams();
    {
      absl::MutexLock lock(&mu_);
      streams_.push_back(std::make_unique<RoundStreams>());
    }
    old.Drain();
  }
  int opened() const { return opened_.load(); }

 private:
  // The last takes new streams; the others outlive the streams they had.
  std::vector<std::unique_ptr<RoundStreams>> streams_ = [] {
    std::vector<std::unique_ptr<RoundStreams>> v;
    v.push_back(std::make_unique<RoundStreams>());
    return v;
  }();
  std::atomic<int> opened_{0};
  absl::Mutex mu_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

v1::StepRequest Round(int delay_ms, int code = 0) {
  v1::StepRequest request;
  v1::VerifyItem* item = request.mutable_verify()->add_items();
  item->set_start(delay_ms);
  item->add_block(code);
  return request;
}

Clock::time_point In(int ms) {
  return Clock::now() + std::chrono::milliseconds(ms);
}

class RoundStreamTest : public ::testing::Test {
 protected:
  void SetUp() override { Serve(0); }
  void TearDown() override {
    client_.reset();
    if (server_) server_->Shutdown(In(1000));
  }
  void Serve(int port) {
    fake_ = std::make_unique<FakeTarget>();
    auto started =
        StartGrpcServer(absl::StrCat("127.0.0.1:", port), {fake_.get()});
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = std::move(started->server);
    port_ = started->port;
  }
  Client& client() {
    if (!client_) {
      channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                     grpc::InsecureChannelCredentials());
      stub_ = v1::Target::NewStub(channel_);
      client_ = std::make_unique<Client>(
          [stub = stub_.get()](grpc::ClientContext* c,
                               grpc::CompletionQueue* cq) {
            return stub->PrepareAsyncRounds(c, cq);
          });
    }
    return *client_;
  }
  bool WaitForStreams(int n) {
    for (int i = 0; i < 500; ++i) {
      if (fake_->streams().size() == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  std::unique_ptr<FakeTarget> fake_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Target::Stub> stub_;
  std::unique_ptr<Client> client_;
};

TEST_F(RoundStreamTest, RoundsAnswerInOrderOnOneStreamAndFailuresKeepIt) {
  for (int i = 0; i < 12; ++i) {
    // Every third round fails with its own code.
    const int code =
        i % 3 == 2 ? static_cast<int>(absl::StatusCode::kNotFound) : 0;
    v1::StepResponse response;
    const absl::Status status =
        client().Call(Round(i, code), &response, In(5000));
    // The round's own status, from the response's code and message.
    EXPECT_EQ(static_cast<int>(status.code()), code) << status;
    if (code != 0) {
      EXPECT_EQ(status.message(), absl::StrCat("round failed ", code));
    }
    EXPECT_EQ(response.code(), code);
    ASSERT_EQ(response.verify().results_size(), 1);
    EXPECT_EQ(response.verify().results(0).accepted(), i);
  }
  EXPECT_EQ(fake_->opened(), 1);
  EXPECT_EQ(fake_->streams().size(), 1);
  // Closing the client ends the service's side of the stream.
  client_.reset();
  EXPECT_TRUE(WaitForStreams(0));
}

TEST_F(RoundStreamTest, RoundPastItsDeadlineCancelsTheStreamAndTheNextReopens) {
  v1::StepResponse response;
  ASSERT_TRUE(client().Call(Round(0), &response, In(5000)).ok());
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status late = client().Call(Round(800), &response, In(50));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_LT(std::chrono::steady_clock::now() - t0,
            std::chrono::milliseconds(700));
  response.Clear();
  ASSERT_TRUE(client().Call(Round(1), &response, In(5000)).ok());
  EXPECT_EQ(response.verify().results(0).accepted(), 1);
  EXPECT_EQ(fake_->opened(), 2);
  // The cancelled stream ends on the service once its round is written.
  EXPECT_TRUE(WaitForStreams(1));
}

// A stream that ended between two rounds, while its client waited for
// nothing: the next round goes out again on a new stream, without an error.
TEST_F(RoundStreamTest, StreamEndedBetweenRoundsIsReopenedForTheNextRound) {
  v1::StepResponse response;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(client().Call(Round(i), &response, In(5000)).ok());
    fake_->EndStreams();
    ASSERT_TRUE(WaitForStreams(0));
  }
  const absl::Status next = client().Call(Round(7), &response, In(5000));
  ASSERT_TRUE(next.ok()) << next;
  EXPECT_EQ(response.verify().results(0).accepted(), 7);
  EXPECT_EQ(fake_->opened(), 4);
}

TEST_F(RoundStreamTest, ServiceDownIsUnavailableAndARestartedOneIsReopened) {
  v1::StepResponse response;
  ASSERT_TRUE(client().Call(Round(0), &response, In(5000)).ok());
  const int port = port_;
  server_->Shutdown(In(0));
  server_.reset();
  fake_.reset();
  const absl::Status down = client().Call(Round(0), &response, In(5000));
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;

  Serve(port);
  // The channel reconnects with its backoff; rounds then go to a new
  // stream on the new service.
  absl::Status up;
  for (int i = 0; i < 100; ++i) {
    up = client().Call(Round(2), &response, In(5000));
    if (up.ok()) break;
    EXPECT_EQ(up.code(), absl::StatusCode::kUnavailable) << up;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(up.ok()) << up;
  EXPECT_EQ(response.verify().results(0).accepted(), 2);
  EXPECT_EQ(fake_->opened(), 1);
}

TEST_F(RoundStreamTest, DrainEndsIdleStreamsAndStreamsAfterTheirRoundInFlight) {
  v1::StepResponse response;
  ASSERT_TRUE(client().Call(Round(0), &response, In(5000)).ok());
  // A second client, idle when the drain comes.
  Client idle(
      [stub = stub_.get()](grpc::ClientContext* c, grpc::CompletionQueue* cq) {
        return stub->PrepareAsyncRounds(c, cq);
      });
  v1::StepResponse idle_response;
  ASSERT_TRUE(idle.Call(Round(0), &idle_response, In(5000)).ok());
  ASSERT_EQ(fake_->streams().size(), 2);

  absl::Status in_flight;
  std::thread round(
      [&] { in_flight = client().Call(Round(400), &response, In(5000)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  fake_->streams().Drain();
  round.join();
  EXPECT_TRUE(in_flight.ok()) << in_flight;
  EXPECT_EQ(response.verify().results(0).accepted(), 400);
  EXPECT_TRUE(WaitForStreams(0));

  // Both clients' next rounds are refused, naming the drain.
  for (Client* c : {&client(), &idle}) {
    const absl::Status refused = c->Call(Round(0), &response, In(5000));
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
    EXPECT_NE(refused.message().find("draining"), std::string::npos) << refused;
  }
}

}  // namespace
}  // namespace dedit
