// dedit::serving in one process: ServeUntilSignal's sequence (warm-up,
// ready file, health, /metrics, signal → NOT_SERVING → before_drain →
// drain of an in-flight RPC → after_drain), its startup errors (a failed
// warm-up among them), ServiceReadiness (warm-up, readiness, poison), the
// /metrics endpoint, fire-and-forget calls and the shared service flags.
// The signals are sent to this process, so main() blocks them before gtest
// or gRPC start a thread.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/serving/fire_and_forget.h"
#include "common/serving/internal_auth.h"
#include "common/serving/metrics_endpoint.h"
#include "common/serving/serve_until_signal.h"
#include "common/serving/server_bootstrap.h"
#include "common/serving/service_flags.h"
#include "common/serving/service_readiness.h"
#include "common/serving/shutdown_signals.h"
#include "dedit/v1/services.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace dedit {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kNamedService[] = "dedit.test.Named";

std::string MakeTempDir() {
  std::string dir =
      absl::StrCat(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp",
                   "/dedit_serving_test.XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) std::abort();
  return dir;
}

// The ports from a ready file, once it exists (up to 20 s).
bool WaitForReadyFile(const std::string& path, int* grpc_port,
                      int* metrics_port) {
  for (int i = 0; i < 2000; ++i) {
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    if (std::sscanf(text.c_str(), "{\"grpc_port\": %d, \"metrics_port\": %d}",
                    grpc_port, metrics_port) == 2) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// "GET <path>" on 127.0.0.1:port; the whole response.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError("connect");
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("write");
  }
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  return response;
}

HealthCheckResponse::ServingStatus CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& name) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  HealthCheckRequest request;
  request.set_service(name);
  HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return HealthCheckResponse::UNKNOWN;
  return response.status();
}

// Target.Info answers `finish_after` after it arrives, from its own
// thread: an RPC in flight when the signal comes.
class SlowInfoService final : public v1::Target::CallbackService {
 public:
  explicit SlowInfoService(std::chrono::milliseconds finish_after)
      : finish_after_(finish_after) {}
  ~SlowInfoService() override {
    absl::MutexLock lock(&mu_);
    for (std::thread& t : threads_) t.join();
  }

  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const v1::TargetInfoRequest*,
                                 v1::TargetInfoResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    response->set_model_name("slow");
    absl::MutexLock lock(&mu_);
    threads_.emplace_back([this, reactor] {
      std::this_thread::sleep_for(finish_after_);
      if (on_finish) on_finish();
      reactor->Finish(grpc::Status::OK);
    });
    arrived.Notify();
    return reactor;
  }

  absl::Notification arrived;
  std::function<void()> on_finish;  // set before the server starts

 private:
  const std::chrono::milliseconds finish_after_;
  absl::Mutex mu_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

// Events from the serve thread and the RPC thread, in order.
class EventLog {
 public:
  void Add(std::string event) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
  }
  std::vector<std::string> events() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return events_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

class ServeUntilSignalTest : public ::testing::Test {
 protected:
  ServeUntilSignalTest() : dir_(MakeTempDir()) {
    options_.binary = "serving_test";
    options_.banner = "a slow Info";
    options_.listen_address = "127.0.0.1:0";
    options_.metrics_address = "127.0.0.1:0";
    options_.ready_file = dir_ + "/ready";
    options_.drain_timeout_ms = 20000;
    registry_ = std::make_shared<prometheus::Registry>();
    prometheus::BuildCounter()
        .Name("dedit_serving_test_total")
        .Help("a counter for the scrape")
        .Register(*registry_)
        .Add({})
        .Increment(3);
  }
  ~ServeUntilSignalTest() override { std::filesystem::remove_all(dir_); }

  // Runs ServeUntilSignal on its own thread (as main() would).
  void StartServing(grpc::Service* service) {
    serve_thread_ = std::thread([this, service] {
      served_ = ServeUntilSignal(options_, {service}, registry_, hooks_);
    });
  }
  absl::Status StopServing(int sig) {
    kill(getpid(), sig);
    serve_thread_.join();
    return served_;
  }

  const std::string dir_;
  ServeOptions options_;
  ServeHooks hooks_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::thread serve_thread_;
  absl::Status served_;
};

TEST_F(ServeUntilSignalTest, ServesThenDrainsAnInFlightRpcOnSigterm) {
  SlowInfoService service(std::chrono::milliseconds(500));
  ServiceReadiness readiness(kNamedService);
  readiness.Set(true);  // before the server exists
  options_.readiness = &readiness;
  EventLog log;
  std::shared_ptr<grpc::Channel> channel;
  hooks_.before_drain = [&] {
    log.Add("before_drain");
    // The server still answers: every name reports NOT_SERVING, and the
    // readiness no longer publishes.
    readiness.Set(true);
    log.Add(absl::StrCat("health ", CheckHealth(channel, ""), " named ",
                         CheckHealth(channel, kNamedService)));
  };
  hooks_.after_drain = [&] { log.Add("after_drain"); };
  service.on_finish = [&] { log.Add("rpc_finished"); };
  StartServing(&service);

  int grpc_port = 0, metrics_port = 0;
  ASSERT_TRUE(WaitForReadyFile(options_.ready_file, &grpc_port, &metrics_port));
  channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", grpc_port),
                                grpc::InsecureChannelCredentials());
  EXPECT_EQ(CheckHealth(channel, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckHealth(channel, kNamedService), HealthCheckResponse::SERVING);
  readiness.Set(false);
  EXPECT_EQ(CheckHealth(channel, kNamedService),
            HealthCheckResponse::NOT_SERVING);
  readiness.Set(true);
  EXPECT_EQ(CheckHealth(channel, kNamedService), HealthCheckResponse::SERVING);

  absl::StatusOr<std::string> scrape = HttpGet(metrics_port, "/metrics");
  ASSERT_TRUE(scrape.ok()) << scrape.status();
  EXPECT_THAT(*scrape, HasSubstr("HTTP/1.1 200"));
  EXPECT_THAT(*scrape, HasSubstr("dedit_serving_test_total 3"));

  grpc::Status rpc_status;
  v1::TargetInfoResponse rpc_response;
  std::thread rpc([&] {
    auto stub = v1::Target::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    rpc_status = stub->Info(&context, v1::TargetInfoRequest(), &rpc_response);
  });
  ASSERT_TRUE(
      service.arrived.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status served = StopServing(SIGTERM);
  const auto drain = std::chrono::steady_clock::now() - t0;
  rpc.join();

  EXPECT_TRUE(served.ok()) << served;
  EXPECT_TRUE(rpc_status.ok()) << rpc_status.error_message();
  EXPECT_EQ(rpc_response.model_name(), "slow");
  const std::string not_serving =
      absl::StrCat("health ", HealthCheckResponse::NOT_SERVING, " named ",
                   HealthCheckResponse::NOT_SERVING);
  EXPECT_THAT(log.events(), ElementsAre("before_drain", not_serving,
                                        "rpc_finished", "after_drain"));
  // The drain ended with the RPC, not at its 20 s deadline.
  EXPECT_LT(drain, std::chrono::seconds(10));
  // The endpoints are gone.
  EXPECT_FALSE(HttpGet(metrics_port, "/metrics").ok());
  readiness.Set(false);  // detached: must not touch the dead server
}

TEST_F(ServeUntilSignalTest, SigintAlsoDrainsAndMetricsServesOnlyMetrics) {
  SlowInfoService service(std::chrono::milliseconds(0));
  bool before_drain = false, after_drain = false;
  hooks_.before_drain = [&] { before_drain = true; };
  hooks_.after_drain = [&] { after_drain = true; };
  StartServing(&service);
  int grpc_port = 0, metrics_port = 0;
  ASSERT_TRUE(WaitForReadyFile(options_.ready_file, &grpc_port, &metrics_port));
  // No readiness and no warm-up (the router): "" is SERVING once ready.
  EXPECT_EQ(
      CheckHealth(grpc::CreateChannel(absl::StrCat("127.0.0.1:", grpc_port),
                                      grpc::InsecureChannelCredentials()),
                  ""),
      HealthCheckResponse::SERVING);
  absl::StatusOr<std::string> other = HttpGet(metrics_port, "/other");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_THAT(*other, HasSubstr("HTTP/1.1 404"));
  absl::StatusOr<std::string> root = HttpGet(metrics_port, "/");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_THAT(*root, HasSubstr("dedit_serving_test_total"));

  EXPECT_TRUE(StopServing(SIGINT).ok());
  EXPECT_TRUE(before_drain);
  EXPECT_TRUE(after_drain);
}

TEST_F(ServeUntilSignalTest, StartupErrorsReturnWithoutRunningTheHooks) {
  SlowInfoService service(std::chrono::milliseconds(0));
  ServiceReadiness readiness(kNamedService);
  options_.readiness = &readiness;
  int hooks_run = 0;
  hooks_.before_drain = [&] { ++hooks_run; };
  hooks_.after_drain = [&] { ++hooks_run; };

  options_.metrics_address = "no-port";
  EXPECT_EQ(ServeUntilSignal(options_, {&service}, registry_, hooks_).code(),
            absl::StatusCode::kInvalidArgument);
  options_.metrics_address = "127.0.0.1:0";
  options_.ready_file = dir_ + "/no/such/dir/ready";
  const absl::Status no_dir =
      ServeUntilSignal(options_, {&service}, registry_, hooks_);
  EXPECT_EQ(no_dir.code(), absl::StatusCode::kNotFound) << no_dir;
  EXPECT_THAT(no_dir.message(), HasSubstr("/no/such/dir/ready"));
  EXPECT_EQ(hooks_run, 0);
  readiness.Set(true);  // detached on the early returns
}

TEST_F(ServeUntilSignalTest, HealthTurnsServingOnlyAfterTheWarmUp) {
  SlowInfoService service(std::chrono::milliseconds(0));
  ServiceReadiness readiness(kNamedService, /*ready=*/true);
  options_.readiness = &readiness;
  // A Unix socket: the address is known before the ready file is written.
  const std::string address = absl::StrCat("unix:", dir_, "/grpc.sock");
  options_.listen_address = address;
  absl::Notification warming, warmed;
  hooks_.warm_up = [&] {
    warming.Notify();
    warmed.WaitForNotification();
    return absl::OkStatus();
  };
  StartServing(&service);
  absl::Cleanup stop = [&] {
    if (!warmed.HasBeenNotified()) warmed.Notify();
    EXPECT_TRUE(StopServing(SIGTERM).ok());
  };
  ASSERT_TRUE(warming.WaitForNotificationWithTimeout(absl::Seconds(10)));
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  // Warming up: the server answers, every status NOT_SERVING, no ready
  // file yet.
  EXPECT_EQ(CheckHealth(channel, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(CheckHealth(channel, kNamedService),
            HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(std::filesystem::exists(options_.ready_file));
  EXPECT_FALSE(readiness.live());

  warmed.Notify();
  int grpc_port = 0, metrics_port = 0;
  ASSERT_TRUE(WaitForReadyFile(options_.ready_file, &grpc_port, &metrics_port));
  EXPECT_EQ(CheckHealth(channel, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckHealth(channel, kNamedService), HealthCheckResponse::SERVING);
}

TEST_F(ServeUntilSignalTest, FailedWarmUpIsReturnedAndNeverServes) {
  SlowInfoService service(std::chrono::milliseconds(0));
  ServiceReadiness readiness(kNamedService, /*ready=*/true);
  options_.readiness = &readiness;
  int hooks_run = 0;
  hooks_.warm_up = [] {
    return absl::InternalError("libtorch: CUDA error: device-side assert");
  };
  hooks_.before_drain = [&] { ++hooks_run; };
  hooks_.after_drain = [&] { ++hooks_run; };
  const absl::Status served =
      ServeUntilSignal(options_, {&service}, registry_, hooks_);
  EXPECT_EQ(served.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(served.message(),
              HasSubstr("warm-up failed: libtorch: CUDA error"));
  EXPECT_FALSE(std::filesystem::exists(options_.ready_file));
  EXPECT_FALSE(readiness.live());
  EXPECT_FALSE(readiness.serving());
  EXPECT_EQ(hooks_run, 0);
}

// A port that needs credentials (here the internal
// token) keeps its statuses on a plaintext health port too, which serves
// nothing else, reports NOT_SERVING through the drain, and closes after it.
TEST_F(ServeUntilSignalTest,
       HealthPortMirrorsTheStatusesOfAnAuthenticatedPort) {
  SlowInfoService service(std::chrono::milliseconds(0));
  ServiceReadiness readiness(kNamedService, /*ready=*/true);
  options_.readiness = &readiness;
  InternalAuthOptions auth_options;
  auth_options.token_file = dir_ + "/token";
  std::ofstream(auth_options.token_file) << "0123456789abcdef0123456789abcdef";
  absl::StatusOr<InternalAuth> auth = InternalAuth::Load(auth_options);
  ASSERT_TRUE(auth.ok()) << auth.status();
  options_.credentials = auth->ServerCredentials();
  options_.health_listen_address = "127.0.0.1:0";
  std::shared_ptr<grpc::Channel> health;
  std::string during_drain;
  hooks_.before_drain = [&] {
    during_drain = absl::StrCat(CheckHealth(health, ""), " ",
                                CheckHealth(health, kNamedService));
  };
  StartServing(&service);
  int grpc_port = 0, metrics_port = 0;
  ASSERT_TRUE(WaitForReadyFile(options_.ready_file, &grpc_port, &metrics_port));
  std::ifstream in(options_.ready_file);
  const std::string ready((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  int health_port = 0;
  const size_t at = ready.find("\"health_port\": ");
  ASSERT_NE(at, std::string::npos) << ready;
  ASSERT_EQ(
      std::sscanf(ready.c_str() + at, "\"health_port\": %d", &health_port), 1);
  health = grpc::CreateChannel(absl::StrCat("127.0.0.1:", health_port),
                               grpc::InsecureChannelCredentials());
  EXPECT_EQ(CheckHealth(health, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckHealth(health, kNamedService), HealthCheckResponse::SERVING);
  readiness.Set(false);
  EXPECT_EQ(CheckHealth(health, kNamedService),
            HealthCheckResponse::NOT_SERVING);
  readiness.Set(true);
  // The health port serves health only; the main port wants the token.
  auto info = [](const std::shared_ptr<grpc::Channel>& channel) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    v1::TargetInfoResponse response;
    return v1::Target::NewStub(channel)
        ->Info(&context, v1::TargetInfoRequest(), &response)
        .error_code();
  };
  EXPECT_EQ(info(health), grpc::StatusCode::UNIMPLEMENTED);
  auto main_port = grpc::CreateChannel(absl::StrCat("127.0.0.1:", grpc_port),
                                       grpc::InsecureChannelCredentials());
  EXPECT_EQ(info(main_port), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CheckHealth(main_port, ""), HealthCheckResponse::SERVING);

  EXPECT_TRUE(StopServing(SIGTERM).ok());
  EXPECT_EQ(during_drain, absl::StrCat(HealthCheckResponse::NOT_SERVING, " ",
                                       HealthCheckResponse::NOT_SERVING));
  EXPECT_EQ(CheckHealth(health, ""), HealthCheckResponse::UNKNOWN);
  readiness.Set(false);  // detached
}

TEST_F(ServeUntilSignalTest, PoisonTurnsOverallAndNamedNotServing) {
  SlowInfoService service(std::chrono::milliseconds(0));
  ServiceReadiness readiness(kNamedService, /*ready=*/true);
  options_.readiness = &readiness;
  hooks_.warm_up = [] { return absl::OkStatus(); };
  StartServing(&service);
  int grpc_port = 0, metrics_port = 0;
  ASSERT_TRUE(WaitForReadyFile(options_.ready_file, &grpc_port, &metrics_port));
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", grpc_port),
                                     grpc::InsecureChannelCredentials());
  EXPECT_EQ(CheckHealth(channel, ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(CheckHealth(channel, kNamedService), HealthCheckResponse::SERVING);
  readiness.SetPoisoned();  // from the model thread, on a sticky error
  EXPECT_EQ(CheckHealth(channel, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(CheckHealth(channel, kNamedService),
            HealthCheckResponse::NOT_SERVING);
  readiness.Set(true);  // for good
  EXPECT_EQ(CheckHealth(channel, ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(CheckHealth(channel, kNamedService),
            HealthCheckResponse::NOT_SERVING);
  EXPECT_TRUE(StopServing(SIGTERM).ok());
}

TEST(StartGrpcServerTest, OverallHealthStartsNotServing) {
  SlowInfoService service(std::chrono::milliseconds(0));
  absl::StatusOr<StartedServer> server =
      StartGrpcServer("127.0.0.1:0", {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port),
                                     grpc::InsecureChannelCredentials());
  EXPECT_EQ(CheckHealth(channel, ""), HealthCheckResponse::NOT_SERVING);
  server->server->Shutdown();
}

// Records what a health service is told.
class FakeHealth final : public grpc::HealthCheckServiceInterface {
 public:
  void SetServingStatus(const std::string& name, bool serving) override {
    calls.push_back(absl::StrCat(name, "=", serving));
  }
  void SetServingStatus(bool serving) override {
    calls.push_back(absl::StrCat("*=", serving));
  }
  std::vector<std::string> calls;
};

TEST(ServiceReadinessTest, PublishesTheLatestStatusOnlyWhileAttached) {
  ServiceReadiness readiness("svc");
  FakeHealth health;
  readiness.SetWarmedUp();
  EXPECT_FALSE(readiness.serving());
  EXPECT_TRUE(readiness.live());
  readiness.Set(true);  // recorded, nothing attached
  readiness.PublishTo(&health);
  readiness.Set(false);
  readiness.Set(true);
  readiness.PublishTo(nullptr);
  readiness.Set(false);  // recorded only
  EXPECT_FALSE(readiness.serving());
  EXPECT_THAT(health.calls,
              ElementsAre("=1", "svc=1", "=1", "svc=0", "=1", "svc=1"));
}

TEST(ServiceReadinessTest, WarmUpGatesBothStatusesAndPoisonEndsThem) {
  ServiceReadiness readiness("svc", /*ready=*/true);
  FakeHealth health;
  readiness.PublishTo(&health);  // before the warm-up: NOT_SERVING
  EXPECT_FALSE(readiness.live());
  EXPECT_FALSE(readiness.serving());
  readiness.Set(true);
  readiness.SetWarmedUp();
  EXPECT_TRUE(readiness.live());
  EXPECT_TRUE(readiness.serving());
  readiness.Set(false);  // the named status alone
  readiness.Set(true);
  readiness.SetPoisoned();
  readiness.Set(true);
  readiness.SetWarmedUp();
  EXPECT_FALSE(readiness.live());
  EXPECT_FALSE(readiness.serving());
  EXPECT_THAT(health.calls, ElementsAre("=0", "svc=0",  // attached
                                        "=0", "svc=0",  // Set(true)
                                        "=1", "svc=1",  // warmed up
                                        "=1", "svc=0", "=1", "svc=1",  // Set
                                        "=0", "svc=0",  // poisoned
                                        "=0", "svc=0", "=0", "svc=0"));
}

TEST(ServiceReadinessTest, ConcurrentSetsEndPublishedAsTheLastOne) {
  ServiceReadiness readiness("svc");
  FakeHealth health;
  readiness.SetWarmedUp();
  readiness.PublishTo(&health);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&readiness, t] {
      for (int i = 0; i < 1000; ++i) readiness.Set((i + t) % 2 == 0);
    });
  }
  for (std::thread& t : threads) t.join();
  readiness.Set(true);
  readiness.PublishTo(nullptr);
  ASSERT_EQ(health.calls.size(), 8004u);
  EXPECT_EQ(health.calls.back(), "svc=1");
}

TEST(MetricsEndpointTest, RejectsBadAddresses) {
  auto registry = std::make_shared<prometheus::Registry>();
  EXPECT_EQ(StartMetricsEndpoint("9100", registry).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StartMetricsEndpoint("127.0.0.1:70000", registry).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StartMetricsEndpoint("example.com:0", registry).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsEndpointTest, StopsPromptlyWhenDestroyed) {
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      StartMetricsEndpoint("localhost:0", registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  EXPECT_GT(port, 0);
  EXPECT_TRUE(HttpGet(port, "/metrics").ok());
  const auto t0 = std::chrono::steady_clock::now();
  endpoint->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_FALSE(HttpGet(port, "/metrics").ok());
}

// A slow-loris client of the metrics port: sends a request one byte every
// `interval`, never finishing it, and notes when the server closes the
// connection.
class SlowLorisClient {
 public:
  SlowLorisClient(int port, std::chrono::milliseconds interval)
      : thread_([this, port, interval] { Run(port, interval); }) {}
  ~SlowLorisClient() { Join(); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  bool connected() const { return connected_; }
  // How long the connection stayed open; nullopt if it never closed
  // within the client's own limit (30 s).
  std::optional<std::chrono::milliseconds> closed_after() const {
    return closed_after_;
  }
  int bytes_sent() const { return sent_; }

 private:
  void Run(int port, std::chrono::milliseconds interval) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      return;
    }
    connected_ = true;
    const auto t0 = std::chrono::steady_clock::now();
    // A request line and headers that never end.
    const std::string dribble =
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    for (size_t i = 0;
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30);
         ++i) {
      const char byte = dribble[i % dribble.size()];
      if (send(fd, &byte, 1, MSG_NOSIGNAL) != 1) break;
      ++sent_;
      // Wait out the interval, watching for the server closing.
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(interval.count())) > 0) {
        char buf[256];
        if (recv(fd, buf, sizeof(buf), 0) <= 0) break;
      }
    }
    const auto open_for = std::chrono::steady_clock::now() - t0;
    if (open_for < std::chrono::seconds(30)) {
      closed_after_ =
          std::chrono::duration_cast<std::chrono::milliseconds>(open_for);
    }
    close(fd);
  }

  std::atomic<bool> connected_{false};
  std::atomic<int> sent_{0};
  std::optional<std::chrono::milliseconds> closed_after_;
  std::thread thread_;  // last: starts once the members exist
};

// GET /metrics over HTTP/1.1 with a client-side timeout; the body.
absl::StatusOr<std::string> ScrapeWithTimeout(int port,
                                              std::chrono::seconds timeout) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{static_cast<time_t>(timeout.count()), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError("connect");
  }
  const std::string request =
      "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("send");
  }
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, n);
  const bool timed_out = n < 0;
  close(fd);
  if (timed_out) return absl::DeadlineExceededError("scrape timed out");
  if (response.compare(0, 12, "HTTP/1.1 200") != 0) {
    return absl::UnavailableError("not 200: " + response.substr(0, 40));
  }
  return response.substr(response.find("\r\n\r\n") + 4);
}

// Five clients that each send a byte every 1.5 s and
// never finish their request no longer hold /metrics. Scrapes running
// meanwhile all succeed (the old endpoint served one connection at a time
// and timed every one of them out), and the slow connections are closed
// at the whole-request deadline.
TEST(MetricsEndpointTest, SlowClientsNeitherBlockScrapesNorStayOpen) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter()
      .Name("dedit_slow_loris_test_total")
      .Help("a counter for the scrape")
      .Register(*registry)
      .Add({})
      .Increment(7);
  const MetricsEndpointOptions defaults;
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      StartMetricsEndpoint("127.0.0.1:0", registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();

  std::vector<std::unique_ptr<SlowLorisClient>> slow;
  for (int i = 0; i < 5; ++i) {
    slow.push_back(std::make_unique<SlowLorisClient>(
        port, std::chrono::milliseconds(1500)));
  }
  // Two scrapers, one scrape each every 250 ms (2 s client timeout), for
  // as long as the slow clients may stay open and a second more.
  std::atomic<int> scrapes{0}, ok{0};
  std::atomic<int64_t> slowest_us{0};
  const auto scrape_for = defaults.request_deadline + std::chrono::seconds(4);
  std::vector<std::thread> scrapers;
  std::vector<std::string> failures[2];
  for (int t = 0; t < 2; ++t) {
    scrapers.emplace_back([&, t] {
      const auto end = std::chrono::steady_clock::now() + scrape_for;
      while (std::chrono::steady_clock::now() < end) {
        const auto t0 = std::chrono::steady_clock::now();
        absl::StatusOr<std::string> body =
            ScrapeWithTimeout(port, std::chrono::seconds(2));
        const int64_t us =
            std::chrono::duration_cast<std::chrono::microseconds>(
                std::chrono::steady_clock::now() - t0)
                .count();
        ++scrapes;
        if (body.ok() &&
            body->find("dedit_slow_loris_test_total 7") != std::string::npos) {
          ++ok;
        } else {
          failures[t].push_back(body.ok() ? "no metric"
                                          : body.status().ToString());
        }
        int64_t seen = slowest_us.load();
        while (us > seen && !slowest_us.compare_exchange_weak(seen, us)) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
      }
    });
  }
  for (std::thread& t : scrapers) t.join();
  for (auto& s : slow) s->Join();

  std::printf(
      "scrapes under 5 slow clients: %d/%d ok, slowest %.1f ms; slow "
      "connections closed after",
      ok.load(), scrapes.load(), slowest_us.load() / 1000.0);
  for (auto& s : slow) {
    EXPECT_TRUE(s->connected());
    ASSERT_TRUE(s->closed_after().has_value())
        << "a slow client stayed connected for 30 s";
    std::printf(" %.1f s", s->closed_after()->count() / 1000.0);
    // At the deadline, noticed within the client's 1.5 s poll.
    EXPECT_GE(*s->closed_after(),
              defaults.request_deadline - std::chrono::milliseconds(100));
    EXPECT_LE(*s->closed_after(),
              defaults.request_deadline + std::chrono::milliseconds(2500));
    EXPECT_LE(s->bytes_sent(), 6);
  }
  std::printf("\n");
  EXPECT_GE(scrapes.load(), 10);
  EXPECT_EQ(ok.load(), scrapes.load())
      << (failures[0].empty() ? "" : failures[0][0])
      << (failures[1].empty() ? "" : failures[1][0]);
}

// The destructor does not wait for a slow client's deadline.
TEST(MetricsEndpointTest, DestructionClosesSlowConnectionsAtOnce) {
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      StartMetricsEndpoint("127.0.0.1:0", registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  SlowLorisClient slow((*endpoint)->port(), std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto t0 = std::chrono::steady_clock::now();
  endpoint->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  slow.Join();
  ASSERT_TRUE(slow.closed_after().has_value());
  EXPECT_LT(*slow.closed_after(), std::chrono::seconds(2));
}

TEST(MetricsEndpointTest, RefusesATakenPortAndOversizedRequests) {
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> first =
      StartMetricsEndpoint("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->port();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> second =
      StartMetricsEndpoint(absl::StrCat("127.0.0.1:", port), registry);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat(port)));

  // Headers past max_request_bytes end the connection without an answer
  // (or with a 400), however fast they come.
  MetricsEndpointOptions small;
  small.max_request_bytes = 1024;
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> bounded =
      StartMetricsEndpoint("127.0.0.1:0", registry, small);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  absl::StatusOr<std::string> huge = HttpGet(
      (*bounded)->port(), absl::StrCat("/metrics HTTP/1.0\r\nX-Big: ",
                                       std::string(4096, 'b'), "\r\nX-End: 1"));
  ASSERT_TRUE(huge.ok()) << huge.status();
  EXPECT_THAT(*huge, ::testing::Not(HasSubstr("HTTP/1.1 200")));
  // A normal scrape still works, HTTP/1.1 included (one request per
  // connection).
  absl::StatusOr<std::string> body =
      ScrapeWithTimeout((*bounded)->port(), std::chrono::seconds(5));
  EXPECT_TRUE(body.ok()) << body.status();
  MetricsEndpointOptions no_threads;
  no_threads.threads = 0;
  EXPECT_EQ(
      StartMetricsEndpoint("127.0.0.1:0", registry, no_threads).status().code(),
      absl::StatusCode::kInvalidArgument);
}

// The router's Release, KeepIdle and KeepAlive (fire_and_forget.h): the
// call reaches the server after FireAndForget returned, and `done` runs
// once it has ended.
TEST(FireAndForgetTest, CallArrivesAndDoneRunsOnceItEnds) {
  SlowInfoService service(std::chrono::milliseconds(100));
  absl::StatusOr<StartedServer> server =
      StartGrpcServer("127.0.0.1:0", {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Target::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port),
                          grpc::InsecureChannelCredentials()));
  absl::Notification ended;
  FireAndForget(stub->async(), &v1::Target::Stub::async::Info,
                v1::TargetInfoRequest(), [&ended] { ended.Notify(); });
  EXPECT_TRUE(
      service.arrived.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  server->server->Shutdown();
}

TEST(FireAndForgetTest, DoneRunsWhenNoServerAnswers) {
  // A port that was just closed: the call fails at once (UNAVAILABLE),
  // long before its deadline.
  SlowInfoService service(std::chrono::milliseconds(0));
  absl::StatusOr<StartedServer> server =
      StartGrpcServer("127.0.0.1:0", {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = server->port;
  server->server->Shutdown();
  server->server.reset();
  auto stub = v1::Target::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  absl::Notification ended;
  v1::ReleaseRequest request;
  request.add_sequences(1);
  FireAndForget(stub->async(), &v1::Target::Stub::async::Release,
                std::move(request), [&ended] { ended.Notify(); });
  EXPECT_TRUE(ended.WaitForNotificationWithTimeout(
      absl::FromChrono(kFireAndForgetDeadline)));
}

TEST(ServiceFlagsTest, ReadsTheSharedFlagsWithTheBinarysOwn) {
  // Nothing else in this binary reads these flags.
  absl::SetFlag(&FLAGS_host, "127.0.0.1");
  absl::SetFlag(&FLAGS_ready_file, "/tmp/ready.json");
  absl::SetFlag(&FLAGS_internal_token_file, "token.txt");
  absl::SetFlag(&FLAGS_tls_cert, "cert.pem");
  absl::SetFlag(&FLAGS_tls_key, "key.pem");
  absl::SetFlag(&FLAGS_tls_ca, "ca.pem");
  const ServiceFlags flags = ReadServiceFlags(50051, 9101, 10000);
  EXPECT_EQ(flags.serve.listen_address, "127.0.0.1:50051");
  EXPECT_EQ(flags.serve.metrics_address, "127.0.0.1:9101");
  EXPECT_EQ(flags.serve.ready_file, "/tmp/ready.json");
  EXPECT_EQ(flags.serve.drain_timeout_ms, 10000);
  EXPECT_EQ(flags.serve.health_listen_address, "");
  EXPECT_EQ(flags.auth.token_file, "token.txt");
  EXPECT_EQ(flags.auth.tls_cert, "cert.pem");
  EXPECT_EQ(flags.auth.tls_key, "key.pem");
  EXPECT_EQ(flags.auth.tls_ca, "ca.pem");
  EXPECT_EQ(flags.auth.tls_server_name, "");
}

}  // namespace
}  // namespace dedit

int main(int argc, char** argv) {
  dedit::BlockShutdownSignals();  // before any thread starts
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
