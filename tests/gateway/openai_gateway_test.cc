// dedit-openai end to end: the bundled checkpoints/tiny pair served by real
// dedit-drafter, dedit-target and dedit-router processes on loopback, the
// gateway in front, and the official OpenAI Node SDK as the client
// (openai_sdk_test.cjs). The expected texts come from the router's gRPC
// stream, checked here against the target's greedy decoding in process.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/model/in_process.h"
#include "common/serving/internal_auth.h"
#include "common/serving/server_bootstrap.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "dedit/v1/services.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"
#include "tests/services/service_cluster.h"
#include "tests/services/stream_client.h"

namespace dedit {
namespace {

using json = nlohmann::json;
using testing::ServiceCluster;
using testing::ServiceProcess;
using testing::WaitFor;
using testing::WaitForRouterReady;

// The gRPC side of the comparisons: one Generate stream read to the end.
testing::Generated GrpcGenerate(v1::Generation::Stub* stub,
                                const v1::GenerateRequest& request) {
  return testing::Generate(stub, request, /*timeout_s=*/120);
}

const std::string kCheckpoints =
    std::string(DEDIT_SOURCE_DIR) + "/checkpoints/tiny";
constexpr int kMaxBodyBytes = 65536;

// User + system CPU seconds a process has used so far (/proc/PID/stat).
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the ")" that closes the command name: state is field 3,
  // utime 14 and stime 15.
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i >= 14) ticks += std::stod(field);
  }
  return ticks / sysconf(_SC_CLK_TCK);
}

// A loopback port nothing listens on (bound to port 0, then closed).
int FreePortForTest() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// One process set for the whole suite (starting it costs seconds).
class OpenAiGatewayTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::MakeTempDir());
    const std::vector<std::string> common = {"--host=127.0.0.1", "--port=0",
                                             "--metrics_port=0",
                                             "--drain_timeout_ms=1000"};
    auto with = [&](std::vector<std::string> args) {
      args.insert(args.end(), common.begin(), common.end());
      return args;
    };
    auto drafter = ServiceProcess::Start(
        DEDIT_DRAFTER_BINARY,
        with({"--drafter_dir=" + kCheckpoints + "/drafter",
              "--target_dir=" + kCheckpoints + "/target", "--threads=1"}),
        *dir_, "drafter");
    ASSERT_TRUE(drafter.ok()) << drafter.status();
    drafter_ = drafter->release();
    const std::string drafter_address =
        absl::StrCat("127.0.0.1:", drafter_->grpc_port());
    auto target = ServiceProcess::Start(
        DEDIT_TARGET_BINARY,
        with({"--target_dir=" + kCheckpoints + "/target",
              "--drafter_dir=" + kCheckpoints + "/drafter",
              "--drafter=" + drafter_address, "--threads=1"}),
        *dir_, "target");
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = target->release();
    auto router = ServiceProcess::Start(
        DEDIT_ROUTER_BINARY,
        with({absl::StrCat("--target=127.0.0.1:", target_->grpc_port()),
              "--drafter=" + drafter_address,
              "--tokenizer=" + kCheckpoints + "/target/tokenizer.json"}),
        *dir_, "router");
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = router->release();
    auto gateway = ServiceProcess::Start(
        DEDIT_OPENAI_BINARY,
        {absl::StrCat("--router=127.0.0.1:", router_->grpc_port()),
         "--host=127.0.0.1", "--port=0", "--max_concurrent_generations=8",
         absl::StrCat("--max_body_bytes=", kMaxBodyBytes),
         "--sse_heartbeat_ms=200", "--drain_timeout_ms=1000"},
        *dir_, "gateway");
    ASSERT_TRUE(gateway.ok()) << gateway.status();
    gateway_ = gateway->release();
  }
  static void TearDownTestSuite() {
    for (ServiceProcess* p : {gateway_, router_, target_, drafter_}) delete p;
    gateway_ = router_ = target_ = drafter_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(gateway_, nullptr);
    stub_ = v1::Generation::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", router_->grpc_port()),
                            grpc::InsecureChannelCredentials()));
    // The router learns the model and the drafter in the background.
    ASSERT_TRUE(WaitForRouterReady(stub_.get(), /*with_drafter=*/true, 30000));
    auto tokenizer =
        Tokenizer::FromFile(kCheckpoints + "/target/tokenizer.json");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer);
  }

  std::string BaseUrl() const {
    return absl::StrCat("http://127.0.0.1:", gateway_->metrics_port(), "/v1");
  }
  std::string SdkDir() const { return OPENAI_SDK_DIR; }
  std::string NodeCommand(const std::string& expected_path,
                          const std::string& mode) const {
    return absl::StrCat("OPENAI_SDK_DIR='", SdkDir(), "' OPENAI_BASE_URL='",
                        BaseUrl(), "' EXPECTED='", expected_path, "' node '",
                        DEDIT_SOURCE_DIR,
                        "/tests/gateway/openai_sdk_test.cjs' ", mode);
  }

  // Defined below, beside the tests that use it.
  void ExpectAbortFreesTheSequence(const json& expected,
                                   const std::string& mode);
  v1::TargetInfoResponse TargetInfo() {
    auto stub = v1::Target::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", target_->grpc_port()),
                            grpc::InsecureChannelCredentials()));
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::TargetInfoResponse info;
    EXPECT_TRUE(stub->Info(&c, {}, &info).ok());
    return info;
  }

  // Runs `request` through the router's gRPC API at T = 0 and checks its
  // tokens against the target's greedy decoding of `prompt_ids` in
  // process; returns the expected OpenAI-side values.
  json Expect(const v1::GenerateRequest& request,
              const std::vector<int32_t>& prompt_ids) {
    const testing::Generated s = GrpcGenerate(stub_.get(), request);
    EXPECT_TRUE(s.status.ok()) << s.status.error_message();
    const std::vector<int32_t> greedy =
        Greedy(prompt_ids, request.max_tokens());
    const v1::TargetInfoResponse info = TargetInfo();
    const std::vector<int32_t> eos(info.eos_token_ids().begin(),
                                   info.eos_token_ids().end());
    // Greedy up to the first EOS, which ends the request and is not
    // output (docs/ARCHITECTURE.md §1 step 7), nor counted in the usage.
    std::vector<int32_t> want;
    for (int32_t t : greedy) {
      if (std::find(eos.begin(), eos.end(), t) != eos.end()) break;
      want.push_back(t);
    }
    EXPECT_EQ(s.tokens, want) << "the router's tokens are not greedy";
    if (want.size() < greedy.size()) {
      EXPECT_EQ(s.last.finish_reason(), v1::FINISH_REASON_STOP)
          << "greedy decoding reached an EOS";
    }
    auto decoded = tokenizer_->Decode(want);
    EXPECT_TRUE(decoded.ok());
    EXPECT_EQ(s.text, decoded.value_or("")) << "the router's text";
    EXPECT_EQ(s.last.usage().prompt_tokens(),
              static_cast<int>(prompt_ids.size()));
    EXPECT_EQ(s.last.usage().completion_tokens(),
              static_cast<int>(want.size()));
    return {
        {"text", s.text},
        {"max_tokens", request.max_tokens()},
        {"prompt_tokens", s.last.usage().prompt_tokens()},
        {"completion_tokens", s.last.usage().completion_tokens()},
        {"finish_reason",
         s.last.finish_reason() == v1::FINISH_REASON_STOP ? "stop" : "length"}};
  }

  std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int n) {
    if (!stack_) {
      InProcessStack::Options o;
      o.target_dir = kCheckpoints + "/target";
      auto stack = InProcessStack::Load(o);
      EXPECT_TRUE(stack.ok()) << stack.status();
      if (!stack.ok()) return {};
      stack_ = std::move(*stack);
    }
    return testing::GreedyReference(stack_->target(), prompt, n);
  }

  static std::string* dir_;
  static ServiceProcess* drafter_;
  static ServiceProcess* target_;
  static ServiceProcess* router_;
  static ServiceProcess* gateway_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<InProcessStack> stack_;
};

std::string* OpenAiGatewayTest::dir_ = nullptr;
ServiceProcess* OpenAiGatewayTest::drafter_ = nullptr;
ServiceProcess* OpenAiGatewayTest::target_ = nullptr;
ServiceProcess* OpenAiGatewayTest::router_ = nullptr;
ServiceProcess* OpenAiGatewayTest::gateway_ = nullptr;

const char kCompletionPrompt[] = "Multiply 7315 by 46.";
const char kChatMessage[] = "Add 128 and 512.";

v1::GenerateRequest TextRequest(const std::string& prompt, int max_tokens) {
  v1::GenerateRequest r;
  r.set_text(prompt);
  r.set_max_tokens(max_tokens);
  r.mutable_sampling()->set_temperature(0);
  return r;
}

// The SDK's completions and chat, streamed and not: text equal to the gRPC
// result and to greedy decoding, usage counts, stop strings, extensions,
// errors (openai_sdk_test.cjs "main").
TEST_F(OpenAiGatewayTest, OfficialSdkMatchesGrpcAndGreedy) {
  json expected;
  {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListModelsResponse models;
    ASSERT_TRUE(stub_->ListModels(&c, {}, &models).ok());
    ASSERT_EQ(models.models_size(), 1);
    expected["model"] = models.models(0).name();
  }
  expected["max_body_bytes"] = kMaxBodyBytes;
  expected["abort_max_tokens"] = 900;

  const v1::GenerateRequest completion = TextRequest(kCompletionPrompt, 48);
  auto completion_ids = tokenizer_->Encode(kCompletionPrompt);
  ASSERT_TRUE(completion_ids.ok());
  expected["completion"] = Expect(completion, *completion_ids);
  expected["completion"]["prompt"] = kCompletionPrompt;

  v1::GenerateRequest chat;
  chat.set_max_tokens(96);
  chat.mutable_sampling()->set_temperature(0);
  v1::ChatMessage* user = chat.mutable_chat()->add_messages();
  user->set_role("user");
  user->set_content(kChatMessage);
  chat.mutable_chat()->set_enable_thinking(false);
  ChatTemplateOptions template_options;
  template_options.enable_thinking = false;
  auto chat_ids =
      EncodeQwen3Chat(*tokenizer_, {{"user", kChatMessage}}, template_options);
  ASSERT_TRUE(chat_ids.ok());
  expected["chat"] = Expect(chat, *chat_ids);
  expected["chat"]["messages"] = {
      {{"role", "user"}, {"content", kChatMessage}}};

  // A stop string from the middle of the completion's text.
  const std::string text = expected["completion"]["text"];
  ASSERT_GE(text.size(), 12u) << text;
  const std::string stop = text.substr(text.size() / 2, 3);
  const std::string cut = text.substr(0, text.find(stop));
  v1::GenerateRequest stopped = completion;
  stopped.add_stop(stop);
  const testing::Generated s = GrpcGenerate(stub_.get(), stopped);
  ASSERT_TRUE(s.status.ok());
  EXPECT_EQ(s.text, cut);
  expected["stop"] = {{"prompt", kCompletionPrompt},
                      {"max_tokens", completion.max_tokens()},
                      {"stop", stop},
                      {"text", cut}};

  const std::string path = *dir_ + "/expected.json";
  std::ofstream(path) << expected.dump(2);
  const std::string command = NodeCommand(path, "main");
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

// Runs the SDK test `mode` with `expected` (a request the client aborts)
// and checks that the abort reached the target and freed it: the sequence
// was there, is gone with its reservation, the router counted a cancelled
// request and the gateway a client disconnect.
void OpenAiGatewayTest::ExpectAbortFreesTheSequence(const json& expected,
                                                    const std::string& mode) {
  const std::string path = absl::StrCat(*dir_, "/", mode, ".json");
  std::ofstream(path) << expected.dump();
  auto gateway_metric = [&](const std::string& name) {
    return ServiceCluster::MetricValue(
        ServiceCluster::Scrape(gateway_->metrics_port()).value_or(""), name);
  };
  auto cancelled = [&] {
    return ServiceCluster::MetricValue(
        ServiceCluster::Scrape(router_->metrics_port()).value_or(""),
        "dedit_requests_total", "status=\"cancelled\"");
  };
  const double disconnects_before =
      gateway_metric("dedit_http_client_disconnects_total");
  const double cancelled_before = cancelled();

  std::atomic<bool> done{false};
  std::atomic<int> most_sequences{0};
  std::thread watcher([&] {
    while (!done) {
      most_sequences =
          std::max(most_sequences.load(), TargetInfo().num_sequences());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  const std::string command = NodeCommand(path, mode);
  const int rc = std::system(command.c_str());
  done = true;
  watcher.join();
  ASSERT_EQ(rc, 0) << command;
  EXPECT_EQ(most_sequences.load(), 1) << "the request never reached the target";
  EXPECT_TRUE(WaitFor([&] { return TargetInfo().num_sequences() == 0; }, 5000))
      << "the aborted sequence is still on the target";
  EXPECT_EQ(TargetInfo().reserved_tokens(), 0);
  // Cancelled, not run to its end: the router counts it so.
  EXPECT_TRUE(WaitFor([&] { return cancelled() > cancelled_before; }, 5000));
  EXPECT_TRUE(WaitFor(
      [&] {
        return gateway_metric("dedit_http_client_disconnects_total") >
               disconnects_before;
      },
      5000));
}

// A client that aborts a stream cancels its router call, which frees the
// sequence on the target.
TEST_F(OpenAiGatewayTest, SdkAbortFreesTheSequenceOnTheTarget) {
  ExpectAbortFreesTheSequence({{"model", ""},
                               {"abort_max_tokens", 900},
                               {"completion", {{"prompt", kCompletionPrompt}}}},
                              "abort");
}

// A client that aborts a non-streamed request (whose body comes only at the
// end) also cancels its router call: the gateway notices the closed
// connection while it waits.
TEST_F(OpenAiGatewayTest, SdkAbortOfANonStreamedRequestFreesTheSequence) {
  ExpectAbortFreesTheSequence({{"model", ""},
                               {"abort_max_tokens", 1500},
                               {"abort_after_ms", 300},
                               {"completion", {{"prompt", kCompletionPrompt}}}},
                              "abort-blocking");
}

// The gateway's /metrics is valid Prometheus text with its names
// (docs/ARCHITECTURE.md §4).
TEST_F(OpenAiGatewayTest, MetricsPassPromtool) {
  httplib::Client client("127.0.0.1", gateway_->metrics_port());
  auto done = client.Post(
      "/v1/completions",
      json({{"prompt", kCompletionPrompt}, {"max_tokens", 2}}).dump(),
      "application/json");
  ASSERT_TRUE(done);
  ASSERT_EQ(done->status, 200);
  // The server counts a response once it is written, so the client can
  // scrape before the count: poll, bounded.
  auto text = ServiceCluster::Scrape(gateway_->metrics_port());
  for (int i = 0; i < 100 && text.ok() &&
                  ServiceCluster::MetricValue(
                      *text, "dedit_http_requests_total", "code=\"200\"") < 1;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    text = ServiceCluster::Scrape(gateway_->metrics_port());
  }
  ASSERT_TRUE(text.ok()) << text.status();
  for (const char* name :
       {"dedit_http_requests_total", "dedit_http_request_duration_seconds",
        "dedit_http_generations_running", "dedit_http_streams_open",
        "dedit_http_client_disconnects_total"}) {
    EXPECT_NE(text->find(name), std::string::npos) << name;
  }
  EXPECT_GE(ServiceCluster::MetricValue(*text, "dedit_http_requests_total",
                                        "code=\"200\""),
            1);
  const std::string path = *dir_ + "/gateway.prom";
  std::ofstream(path) << *text;
  const std::string command =
      absl::StrCat("promtool check metrics < '", path, "'");
  EXPECT_EQ(std::system(command.c_str()), 0) << *text;
}

// SIGTERM: a running stream finishes ([DONE]), new requests get 503, and
// the process exits 0 after the drain.
TEST_F(OpenAiGatewayTest, SigtermDrainsRunningStreams) {
  auto started = ServiceProcess::Start(
      DEDIT_OPENAI_BINARY,
      {absl::StrCat("--router=127.0.0.1:", router_->grpc_port()),
       "--host=127.0.0.1", "--port=0", "--drain_timeout_ms=20000"},
      *dir_, "draining_gateway");
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<ServiceProcess> gateway = std::move(*started);
  const int port = gateway->metrics_port();
  std::atomic<bool> first_chunk{false};
  std::string sse;
  std::thread stream([&] {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(60, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json({{"prompt", kCompletionPrompt},
                     {"max_tokens", 900},
                     {"ignore_eos", true},
                     {"temperature", 0},
                     {"stream", true}})
                   .dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      sse.append(data, n);
      first_chunk = true;
      return true;
    };
    httplib::Response res;
    httplib::Error error;
    client.send(req, res, error);
  });
  ASSERT_TRUE(WaitFor([&] { return first_chunk.load(); }, 30000));
  int exit_code = -2;
  std::thread terminate([&] { exit_code = gateway->Terminate(30000); });
  EXPECT_TRUE(WaitFor(
      [&] {
        httplib::Client client("127.0.0.1", port);
        auto refused =
            client.Post("/v1/completions", json({{"prompt", "x"}}).dump(),
                        "application/json");
        return refused && refused->status == 503;
      },
      10000))
      << "new requests are refused while draining";
  stream.join();
  terminate.join();
  EXPECT_NE(sse.find("data: [DONE]"), std::string::npos);
  EXPECT_NE(sse.find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_EQ(exit_code, 0);
}

// README's curl and SDK examples, run against the gateway (extracted from
// README.md, so they cannot drift).
TEST_F(OpenAiGatewayTest, ReadmeExamplesRun) {
  const std::string command =
      absl::StrCat("bash '", DEDIT_SOURCE_DIR,
                   "/tests/gateway/run_readme_examples.sh' '", DEDIT_SOURCE_DIR,
                   "/README.md' 'http://127.0.0.1:", gateway_->metrics_port(),
                   "' '", SdkDir(), "'");
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

// More generations than --max_concurrent_generations: the extra ones get
// 429 at once while the others stream.
// The gateway→router hop authenticated like the internal ones: a stack in
// token mode whose router takes only calls carrying the token
// (--authenticate_clients). A gateway given the token file answers; one
// without it cannot get through, nor can a bare gRPC client; the router's
// health stays open for probes.
TEST_F(OpenAiGatewayTest, RouterHopNeedsTheInternalToken) {
  const std::string token_file = *dir_ + "/hop.token";
  std::ofstream(token_file) << "0123456789abcdef0123456789abcdef\n";
  const std::vector<std::string> common = {
      "--host=127.0.0.1", "--port=0", "--metrics_port=0",
      "--drain_timeout_ms=1000", "--internal_token_file=" + token_file};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), common.begin(), common.end());
    return args;
  };
  auto drafter = ServiceProcess::Start(
      DEDIT_DRAFTER_BINARY,
      with({"--drafter_dir=" + kCheckpoints + "/drafter",
            "--target_dir=" + kCheckpoints + "/target", "--threads=1"}),
      *dir_, "hop_drafter");
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  const std::string drafter_address =
      absl::StrCat("127.0.0.1:", (*drafter)->grpc_port());
  auto target = ServiceProcess::Start(
      DEDIT_TARGET_BINARY,
      with({"--target_dir=" + kCheckpoints + "/target",
            "--drafter_dir=" + kCheckpoints + "/drafter",
            "--drafter=" + drafter_address, "--threads=1"}),
      *dir_, "hop_target");
  ASSERT_TRUE(target.ok()) << target.status();
  auto router = ServiceProcess::Start(
      DEDIT_ROUTER_BINARY,
      with({absl::StrCat("--target=127.0.0.1:", (*target)->grpc_port()),
            "--drafter=" + drafter_address, "--authenticate_clients",
            "--tokenizer=" + kCheckpoints + "/target/tokenizer.json"}),
      *dir_, "hop_router");
  ASSERT_TRUE(router.ok()) << router.status();
  const std::string router_address =
      absl::StrCat("127.0.0.1:", (*router)->grpc_port());
  // The router learns the model in the background: until it has reached
  // the target it answers UNAVAILABLE (a 503 at the gateway), which must
  // not be read as the refusal checked below. Asked with the token.
  InternalAuthOptions hop;
  hop.token_file = token_file;
  absl::StatusOr<InternalAuth> hop_auth = InternalAuth::Load(hop);
  ASSERT_TRUE(hop_auth.ok()) << hop_auth.status();
  auto router_stub = v1::Generation::NewStub(
      hop_auth->Channel(router_address, InternalChannelArguments()));
  ASSERT_TRUE(
      WaitForRouterReady(router_stub.get(), /*with_drafter=*/true, 30000))
      << "the router never reached its target and drafter";
  std::string body;  // the last answer's, for the failure messages
  auto completion = [&](const std::vector<std::string>& auth) {
    std::vector<std::string> args = {"--router=" + router_address,
                                     "--host=127.0.0.1", "--port=0",
                                     "--drain_timeout_ms=1000"};
    args.insert(args.end(), auth.begin(), auth.end());
    auto gateway =
        ServiceProcess::Start(DEDIT_OPENAI_BINARY, args, *dir_, "hop_gateway");
    EXPECT_TRUE(gateway.ok()) << gateway.status();
    if (!gateway.ok()) return -1;
    httplib::Client client("127.0.0.1", (*gateway)->metrics_port());
    client.set_read_timeout(60, 0);
    auto res = client.Post("/v1/completions",
                           R"({"prompt": "def add(a, b):", "max_tokens": 4})",
                           "application/json");
    body = res ? res->body : "(no answer)";
    return res ? res->status : -1;
  };
  EXPECT_EQ(completion({"--internal_token_file=" + token_file}), 200) << body;
  // Refused by the router: the gateway's problem, a 503 to its client.
  EXPECT_EQ(completion({}), 503) << body;
  // A bare gRPC client: refused; health answers.
  auto channel =
      grpc::CreateChannel(router_address, grpc::InsecureChannelCredentials());
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListModelsResponse models;
  EXPECT_FALSE(
      v1::Generation::NewStub(channel)->ListModels(&c, {}, &models).ok());
}

// A gateway whose router is down: /v1/models and /health answer 503 with
// the usual error body, and no answer names the router's address (the
// operator finds it in the gateway's log).
TEST_F(OpenAiGatewayTest, RouterDownIs503WithoutInternalAddresses) {
  const std::string dead = absl::StrCat("127.0.0.1:", FreePortForTest());
  auto gateway = ServiceProcess::Start(DEDIT_OPENAI_BINARY,
                                       {"--router=" + dead, "--host=127.0.0.1",
                                        "--port=0", "--drain_timeout_ms=1000"},
                                       *dir_, "gateway-no-router");
  ASSERT_TRUE(gateway.ok()) << gateway.status();
  httplib::Client client("127.0.0.1", (*gateway)->metrics_port());
  client.set_read_timeout(30, 0);
  for (const char* path : {"/v1/models", "/health"}) {
    auto res = client.Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 503) << path << ": " << res->body;
    const json body = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(body.contains("error")) << path << ": " << res->body;
    EXPECT_EQ(body["error"]["type"], "service_unavailable_error") << path;
    EXPECT_EQ(res->body.find("127.0.0.1"), std::string::npos) << res->body;
    EXPECT_EQ(res->body.find(dead), std::string::npos) << res->body;
  }
  auto res = client.Post("/v1/completions",
                         json({{"prompt", "x"}, {"max_tokens", 4}}).dump(),
                         "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503) << res->body;
  EXPECT_EQ(res->body.find("127.0.0.1"), std::string::npos) << res->body;
}

TEST_F(OpenAiGatewayTest, ConcurrencyLimitAnswers429) {
  // The target is stopped (SIGSTOP) while the slots fill, so that no
  // generation can progress, finish and free its slot before the ninth
  // request is refused: the tiny model ends a stream in about a second, and
  // a stream's bytes fit in loopback's socket buffers whether or not its
  // client reads them. Continued however the test ends.
  ASSERT_EQ(kill(target_->pid(), SIGSTOP), 0);
  absl::Cleanup resume = [&] { kill(target_->pid(), SIGCONT); };
  std::vector<std::thread> streams;
  absl::Cleanup join = [&] {
    kill(target_->pid(), SIGCONT);
    for (std::thread& t : streams) {
      if (t.joinable()) t.join();
    }
  };
  const std::string body = json({{"prompt", kCompletionPrompt},
                                 {"max_tokens", 600},
                                 {"ignore_eos", true},
                                 {"temperature", 0},
                                 {"stream", true}})
                               .dump();
  for (int i = 0; i < 8; ++i) {
    streams.emplace_back([&] {
      httplib::Client client("127.0.0.1", gateway_->metrics_port());
      client.set_read_timeout(60, 0);
      client.Post("/v1/completions", body, "application/json");
    });
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        return ServiceCluster::MetricValue(
                   ServiceCluster::Scrape(gateway_->metrics_port())
                       .value_or(""),
                   "dedit_http_generations_running") == 8;
      },
      30000));
  httplib::Client client("127.0.0.1", gateway_->metrics_port());
  auto refused = client.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 429);
  EXPECT_EQ(json::parse(refused->body)["error"]["code"],
            "too_many_concurrent_requests");
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200) << "a free pool thread answers /health";
  std::move(join).Invoke();
  auto after = client.Post(
      "/v1/completions",
      json({{"prompt", kCompletionPrompt}, {"max_tokens", 2}}).dump(),
      "application/json");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200) << "slots are given back";
}

// The per-token cost of HTTP streaming against gRPC streaming through the
// same router (docs/SERVICES.md reports the numbers). Target-only decoding
// sends one message per token, the worst case for per-message overhead.
TEST_F(OpenAiGatewayTest, HttpStreamingOverheadAgainstGrpc) {
  constexpr int kTokens = 256;
  constexpr int kRuns = 7;
  for (bool speculate : {false, true}) {
    std::vector<double> grpc_us, http_us;
    v1::GenerateRequest request = TextRequest(kCompletionPrompt, kTokens);
    request.set_ignore_eos(true);
    request.set_disable_speculation(!speculate);
    const std::string body = json({{"prompt", kCompletionPrompt},
                                   {"max_tokens", kTokens},
                                   {"ignore_eos", true},
                                   {"temperature", 0},
                                   {"disable_speculation", !speculate},
                                   {"stream", true}})
                                 .dump();
    std::string grpc_text;
    double gateway_cpu_s = 0;
    for (int run = 0; run < kRuns; ++run) {
      auto start = std::chrono::steady_clock::now();
      const testing::Generated s = GrpcGenerate(stub_.get(), request);
      ASSERT_TRUE(s.status.ok());
      ASSERT_EQ(s.tokens.size(), static_cast<size_t>(kTokens));
      grpc_us.push_back(std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - start)
                            .count() /
                        kTokens);
      grpc_text = s.text;

      httplib::Client client("127.0.0.1", gateway_->metrics_port());
      client.set_read_timeout(120, 0);
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = body;
      req.set_header("Content-Type", "application/json");
      std::string sse;
      req.content_receiver = [&](const char* data, size_t n, uint64_t,
                                 uint64_t) {
        sse.append(data, n);
        return true;
      };
      httplib::Response res;
      httplib::Error error;
      const double cpu_before = CpuSeconds(gateway_->pid());
      start = std::chrono::steady_clock::now();
      ASSERT_TRUE(client.send(req, res, error));
      gateway_cpu_s += CpuSeconds(gateway_->pid()) - cpu_before;
      http_us.push_back(std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - start)
                            .count() /
                        kTokens);
      // The SSE text equals the gRPC text.
      std::string text;
      for (size_t at = sse.find("data: {"); at != std::string::npos;
           at = sse.find("data: {", at + 1)) {
        const json chunk =
            json::parse(sse.substr(at + 6, sse.find("\n\n", at) - at - 6));
        text += chunk["choices"][0]["text"].get<std::string>();
      }
      EXPECT_EQ(text, grpc_text);
      EXPECT_NE(sse.find("data: [DONE]"), std::string::npos);
    }
    std::sort(grpc_us.begin(), grpc_us.end());
    std::sort(http_us.begin(), http_us.end());
    const double g = grpc_us[kRuns / 2], h = http_us[kRuns / 2];
    std::printf(
        "overhead (%s, %d tokens, median of %d): gRPC %.1f us/token, HTTP "
        "SSE %.1f us/token, difference %+.1f us/token (%+.1f%%); gateway "
        "CPU %.1f us/token\n",
        speculate ? "speculative" : "target-only", kTokens, kRuns, g, h, h - g,
        100.0 * (h - g) / g, 1e6 * gateway_cpu_s / (kRuns * kTokens));
    RecordProperty(speculate ? "speculative_http_minus_grpc_us_per_token"
                             : "target_only_http_minus_grpc_us_per_token",
                   std::to_string(h - g));
    // A sanity bound, not a benchmark: the front must not double the cost.
    EXPECT_LT(h, 2 * g + 200);
  }
}

}  // namespace
}  // namespace dedit
