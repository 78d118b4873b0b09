// dedit-openai against hostile clients: each limit of its HTTP front
// (gateway/http_server.h) attacked over raw sockets, with small flag values
// so that each test takes seconds. The router is a stub in this process
// (a gRPC Generation service that echoes the prompt), so the gateway is the
// only real process and its RSS is the one measured.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dedit/v1/services.grpc.pb.h"
#include "gtest/gtest.h"

namespace dedit {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The router's Generation service, enough for the gateway: one model, and
// a Generate that streams `max_tokens` messages, the first carrying the
// prompt (so answers can be matched to requests). A prompt "slow:..."
// waits 20 ms per message; "big:..." sends 16 KiB per message, one every
// 2 ms.
class StubRouter final : public v1::Generation::Service {
 public:
  grpc::Status ListModels(grpc::ServerContext*, const v1::ListModelsRequest*,
                          v1::ListModelsResponse* response) override {
    v1::ModelCard* card = response->add_models();
    card->set_name("stub");
    card->set_max_context(65536);
    card->set_max_tokens_limit(65536);
    card->set_has_tokenizer(true);
    return grpc::Status::OK;
  }

  grpc::Status Generate(
      grpc::ServerContext* context, const v1::GenerateRequest* request,
      grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    const std::string& prompt = request->text();
    const bool slow = prompt.rfind("slow:", 0) == 0;
    const bool big = prompt.rfind("big:", 0) == 0;
    for (int i = 0; i < request->max_tokens(); ++i) {
      if (context->IsCancelled()) {
        cancelled_.fetch_add(1);
        return grpc::Status::CANCELLED;
      }
      if (slow || big) {
        std::this_thread::sleep_for(std::chrono::milliseconds(slow ? 20 : 2));
      }
      v1::GenerateResponse message;
      message.add_token_ids(i);
      message.set_text(i == 0 ? prompt : big ? std::string(16384, 'x') : " t");
      if (i + 1 == request->max_tokens()) {
        message.set_finished(true);
        message.set_finish_reason(v1::FINISH_REASON_LENGTH);
        message.mutable_usage()->set_prompt_tokens(1);
        message.mutable_usage()->set_completion_tokens(request->max_tokens());
      }
      if (!writer->Write(message)) {
        cancelled_.fetch_add(1);
        return grpc::Status::CANCELLED;
      }
    }
    return grpc::Status::OK;
  }

  int cancelled() const { return cancelled_.load(); }

 private:
  std::atomic<int> cancelled_{0};
};

// A dedit-openai child process in front of the stub.
class Gateway {
 public:
  Gateway(int router_port, const std::vector<std::string>& flags) {
    ready_file_ = absl::StrCat(::testing::TempDir(), "/gateway-", getpid(), "-",
                               counter_++, ".ready");
    std::remove(ready_file_.c_str());
    std::vector<std::string> args = {
        DEDIT_OPENAI_BINARY,
        absl::StrCat("--router=127.0.0.1:", router_port),
        "--host=127.0.0.1",
        "--port=0",
        "--drain_timeout_ms=500",
        "--ready_file=" + ready_file_};
    args.insert(args.end(), flags.begin(), flags.end());
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline && port_ == 0) {
      std::ifstream in(ready_file_);
      const json ready = json::parse(in, nullptr, false);
      if (!ready.is_discarded() && ready.contains("metrics_port")) {
        port_ = ready["metrics_port"].get<int>();
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
  ~Gateway() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }

  // Resident memory in KiB (VmRSS).
  long RssKiB() const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    }
    return -1;
  }

 private:
  static inline int counter_ = 0;
  std::string ready_file_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// A blocking TCP client socket to 127.0.0.1:port, from `source` (another
// loopback address is another client to the gateway). -1 on failure.
int Connect(int port, const char* source = "127.0.0.1") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  inet_pton(AF_INET, source, &local.sin_addr);
  bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n =
        send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += n;
  }
  return true;
}

// Whether `fd` has something to read (or is closed) within `timeout_ms`.
bool Readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, timeout_ms) > 0;
}

// Everything until the peer closes, or what came within `timeout_ms`.
// *closed tells which.
std::string ReadUntilClose(int fd, int timeout_ms, bool* closed = nullptr) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string out;
  char buffer[65536];
  if (closed) *closed = false;
  while (Clock::now() < deadline) {
    const int left =
        static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                             deadline - Clock::now())
                             .count());
    if (!Readable(fd, std::max(left, 1))) break;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) {
      if (closed) *closed = true;
      break;
    }
    out.append(buffer, n);
  }
  return out;
}

// The status of the first response in `bytes`; 0 when there is none.
int StatusOf(const std::string& bytes) {
  if (bytes.rfind("HTTP/1.1 ", 0) != 0 || bytes.size() < 12) return 0;
  return std::atoi(bytes.substr(9, 3).c_str());
}

struct Response {
  int status = 0;
  std::string head;
  std::string body;
};

// Responses with a Content-Length, one after another.
std::vector<Response> ParseResponses(const std::string& bytes) {
  std::vector<Response> out;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t end = bytes.find("\r\n\r\n", at);
    if (end == std::string::npos) break;
    Response r;
    r.head = bytes.substr(at, end + 4 - at);
    r.status = StatusOf(r.head);
    const size_t cl = r.head.find("Content-Length: ");
    const size_t length =
        cl == std::string::npos ? 0 : std::stoul(r.head.substr(cl + 16));
    r.body = bytes.substr(end + 4, length);
    out.push_back(r);
    at = end + 4 + length;
  }
  return out;
}

// One request on a fresh connection from `source`, closed after the
// answer: the status (0 for none within the timeout) and the seconds it
// took.
std::pair<int, double> Request(int port, const std::string& method,
                               const std::string& path,
                               const std::string& body = "",
                               int timeout_ms = 10000,
                               const char* source = "127.0.0.1") {
  const auto start = Clock::now();
  const int fd = Connect(port, source);
  if (fd < 0) return {0, SecondsSince(start)};
  std::string request = absl::StrCat(method, " ", path,
                                     " HTTP/1.1\r\nHost: x\r\nConnection: "
                                     "close\r\n");
  if (method == "POST") {
    absl::StrAppend(&request, "Content-Type: application/json\r\n",
                    "Content-Length: ", body.size(), "\r\n");
  }
  absl::StrAppend(&request, "\r\n", body);
  SendAll(fd, request);
  const std::string answer = ReadUntilClose(fd, timeout_ms);
  close(fd);
  return {StatusOf(answer), SecondsSince(start)};
}

std::string CompletionBody(const std::string& prompt, int max_tokens,
                           bool stream = false) {
  return json({{"prompt", prompt},
               {"max_tokens", max_tokens},
               {"stream", stream}})
      .dump();
}

std::string Post(const std::string& path, const std::string& body,
                 bool close_after = false) {
  return absl::StrCat("POST ", path,
                      " HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      "application/json\r\nContent-Length: ",
                      body.size(), "\r\n",
                      close_after ? "Connection: close\r\n" : "", "\r\n", body);
}

// The refusal every limit answers with: the status, OpenAI's error body,
// and the connection closed.
void ExpectRefusal(const std::string& answer, bool closed, int status) {
  EXPECT_EQ(StatusOf(answer), status) << answer.substr(0, 200);
  EXPECT_NE(answer.find("Connection: close\r\n"), std::string::npos);
  const size_t body = answer.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos) << answer;
  const json error = json::parse(answer.substr(body + 4), nullptr, false);
  EXPECT_TRUE(error.contains("error")) << answer;
  EXPECT_TRUE(closed) << "the connection stays open after " << status;
}

class HttpLimitsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    router_ = new StubRouter;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &router_port_);
    builder.RegisterService(router_);
    server_ = builder.BuildAndStart().release();
  }
  static void TearDownTestSuite() {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(1));
    delete server_;
    delete router_;
  }

  // A gateway with small limits, overridden or extended by `flags` (a
  // later flag wins).
  std::unique_ptr<Gateway> Start(std::vector<std::string> flags = {}) {
    std::vector<std::string> all = {
        "--header_timeout_ms=1000", "--body_timeout_ms=1000",
        "--keep_alive_timeout_s=1", "--write_timeout_s=1",
        "--max_body_bytes=65536",   "--max_connections_per_client=16",
        "--sse_heartbeat_ms=100",   "--max_concurrent_generations=8"};
    all.insert(all.end(), flags.begin(), flags.end());
    auto gateway = std::make_unique<Gateway>(router_port_, all);
    EXPECT_GT(gateway->port(), 0) << "dedit-openai did not start";
    return gateway;
  }

  static StubRouter* router_;
  static grpc::Server* server_;
  static int router_port_;
};

StubRouter* HttpLimitsTest::router_ = nullptr;
grpc::Server* HttpLimitsTest::server_ = nullptr;
int HttpLimitsTest::router_port_ = 0;

// Slowloris from one address: 70 connections each sending a header byte
// every 100 ms. Past its share (32) they get 429 at once; the rest hold no
// thread and get 408 at the 2 s header deadline. Meanwhile /health and a
// completion, from another address, keep answering promptly.
TEST_F(HttpLimitsTest, SlowlorisIsCutOffWhileHealthAndCompletionsAnswer) {
  constexpr int kSlow = 70;
  constexpr int kShare = 32;
  auto gateway = Start({"--header_timeout_ms=2000",
                        absl::StrCat("--max_connections_per_client=", kShare)});
  ASSERT_GT(gateway->port(), 0);
  std::vector<int> slow;
  for (int i = 0; i < kSlow; ++i) slow.push_back(Connect(gateway->port()));
  const auto start = Clock::now();
  // Written by the dribbling thread only, read after it ends.
  std::vector<double> answered_s(kSlow, -1);
  std::vector<std::string> answers(kSlow);
  std::thread dribble([&] {
    const std::string header = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    int waiting = kSlow;
    for (size_t byte = 0; waiting > 0 && SecondsSince(start) < 10; ++byte) {
      for (int i = 0; i < kSlow; ++i) {
        if (answered_s[i] >= 0) continue;
        if (Readable(slow[i], 0)) {
          bool closed = false;
          answers[i] = ReadUntilClose(slow[i], 5000, &closed);
          answered_s[i] = closed ? SecondsSince(start) : -2;
          --waiting;
          continue;
        }
        // The request line, then an endless header value.
        const char next = byte < header.size() ? header[byte] : 'a';
        send(slow[i], &next, 1, MSG_NOSIGNAL);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  double slowest_health = 0, slowest_completion = 0;
  int probes = 0;
  while (SecondsSince(start) < 2.5) {
    const auto [health, health_s] =
        Request(gateway->port(), "GET", "/health", "", 10000, "127.0.0.2");
    EXPECT_EQ(health, 200);
    slowest_health = std::max(slowest_health, health_s);
    const auto [completion, completion_s] =
        Request(gateway->port(), "POST", "/v1/completions",
                CompletionBody("hello", 4), 10000, "127.0.0.2");
    EXPECT_EQ(completion, 200);
    slowest_completion = std::max(slowest_completion, completion_s);
    ++probes;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  dribble.join();
  // Generous bounds: this asserts that nothing starves, not a speed.
  EXPECT_LT(slowest_health, 2.0);
  EXPECT_LT(slowest_completion, 2.0);
  int timed_out = 0, refused = 0;
  double first = 1e9, last = 0;
  for (int i = 0; i < kSlow; ++i) {
    const int status = StatusOf(answers[i]);
    EXPECT_TRUE(status == 408 || status == 429) << i << ": " << answers[i];
    EXPECT_GE(answered_s[i], 0) << i << " was not closed";
    if (status == 429) ++refused;
    if (status == 408) {
      ++timed_out;
      first = std::min(first, answered_s[i]);
      last = std::max(last, answered_s[i]);
    }
    close(slow[i]);
  }
  EXPECT_EQ(timed_out, kShare);
  EXPECT_EQ(refused, kSlow - kShare);
  // At the 2 s deadline (counted from the accept), not before.
  EXPECT_GE(first, 1.5);
  EXPECT_LT(last, 6.0);
  std::printf(
      "slowloris: %d connections: %d refused 429 at once, %d answered 408 at "
      "%.2f-%.2f s; %d probes, slowest /health %.3f s, slowest completion "
      "%.3f s\n",
      kSlow, refused, timed_out, first, last, probes, slowest_health,
      slowest_completion);
  RecordProperty("slowest_health_ms", std::to_string(slowest_health * 1e3));
}

// More connections than a client's share get 429 at the accept, more than
// the total 503, each without a request read; a freed share is reusable.
TEST_F(HttpLimitsTest, ConnectionCapsPerClientAndInTotal) {
  auto gateway =
      Start({"--header_timeout_ms=5000", "--max_connections_per_client=4",
             "--max_connections=6"});
  ASSERT_GT(gateway->port(), 0);
  std::vector<int> open;
  for (int i = 0; i < 4; ++i) open.push_back(Connect(gateway->port()));
  // Counted at the accept: wait until the gateway has seen all four.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int fifth = Connect(gateway->port());
  bool closed = false;
  const std::string refused = ReadUntilClose(fifth, 3000, &closed);
  ExpectRefusal(refused, closed, 429);
  EXPECT_NE(refused.find("too_many_connections"), std::string::npos);
  EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos);
  close(fifth);

  // Another client address has its own share, within the total of 6.
  open.push_back(Connect(gateway->port(), "127.0.0.2"));
  open.push_back(Connect(gateway->port(), "127.0.0.2"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int seventh = Connect(gateway->port(), "127.0.0.3");
  const std::string full = ReadUntilClose(seventh, 3000, &closed);
  ExpectRefusal(full, closed, 503);
  close(seventh);

  // Closing one of the first client's connections frees its share.
  close(open[0]);
  open.erase(open.begin());
  int status = 0;
  for (int attempt = 0; attempt < 20 && status != 200; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    status = Request(gateway->port(), "GET", "/health").first;
  }
  EXPECT_EQ(status, 200);
  for (int fd : open) close(fd);
}

// A chunked body that grows past --max_body_bytes in small chunks is
// refused (413) as soon as it crosses, and the gateway's memory does not
// follow the bytes the client tries to send (300 MiB).
TEST_F(HttpLimitsTest, ChunkedBodyOverTheLimitIs413AndRssStaysBounded) {
  auto gateway = Start();
  ASSERT_GT(gateway->port(), 0);
  ASSERT_EQ(Request(gateway->port(), "GET", "/health").first, 200);  // warm
  const long rss_before = gateway->RssKiB();
  const int fd = Connect(gateway->port());
  ASSERT_TRUE(SendAll(fd,
                      "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n"));
  const std::string chunk = "1000\r\n" + std::string(4096, 'a') + "\r\n";
  const size_t attack_bytes = size_t{300} << 20;
  size_t sent = 0;
  size_t offset = 0;  // into `chunk`, so that a partial send keeps framing
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  std::string answer;
  const auto start = Clock::now();
  while (sent < attack_bytes && SecondsSince(start) < 20) {
    pollfd p{fd, POLLIN | POLLOUT, 0};
    poll(&p, 1, 1000);
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) break;
    const ssize_t n =
        send(fd, chunk.data() + offset, chunk.size() - offset, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN) break;
    if (n > 0) {
      sent += n;
      offset = (offset + n) % chunk.size();
    }
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  bool closed = false;
  answer = ReadUntilClose(fd, 5000, &closed);
  close(fd);
  const long rss_after = gateway->RssKiB();
  ExpectRefusal(answer, closed, 413);
  EXPECT_NE(answer.find("exceeds 65536 bytes"), std::string::npos);
  // The gateway stopped reading near the limit; what it drained after the
  // answer (its linger) is bounded too.
  EXPECT_LT(sent, size_t{32} << 20);
  EXPECT_LT(rss_after - rss_before, 8 * 1024)
      << "RSS " << rss_before << " -> " << rss_after << " KiB";
  std::printf(
      "chunked attack: %zu bytes sent before the 413; RSS %ld -> %ld "
      "KiB (%+ld KiB)\n",
      sent, rss_before, rss_after, rss_after - rss_before);
  RecordProperty("rss_growth_kib", std::to_string(rss_after - rss_before));

  // One chunk larger than the limit is refused at its size line.
  const int big = Connect(gateway->port());
  SendAll(big,
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
          "Transfer-Encoding: chunked\r\n\r\n12C00000\r\n");
  answer = ReadUntilClose(big, 3000, &closed);
  ExpectRefusal(answer, closed, 413);
  close(big);
}

// A Content-Length over the limit is refused from the header alone.
TEST_F(HttpLimitsTest, ContentLengthOverTheLimitIs413WithoutTheBody) {
  auto gateway = Start();
  ASSERT_GT(gateway->port(), 0);
  const int fd = Connect(gateway->port());
  const auto start = Clock::now();
  SendAll(fd,
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
          "Content-Length: 314572800\r\n\r\n");
  bool closed = false;
  const std::string answer = ReadUntilClose(fd, 3000, &closed);
  close(fd);
  ExpectRefusal(answer, closed, 413);
  EXPECT_LT(SecondsSince(start), 1.0);
}

TEST_F(HttpLimitsTest, PostWithoutALengthIs411) {
  auto gateway = Start();
  ASSERT_GT(gateway->port(), 0);
  const int fd = Connect(gateway->port());
  SendAll(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n{\"a\": 1}");
  bool closed = false;
  const std::string answer = ReadUntilClose(fd, 3000, &closed);
  close(fd);
  ExpectRefusal(answer, closed, 411);
}

// Over --max_request_line_bytes: 414, whether the line is complete or not.
TEST_F(HttpLimitsTest, RequestLineOverTheLimitIs414) {
  auto gateway = Start({"--max_request_line_bytes=1024"});
  ASSERT_GT(gateway->port(), 0);
  const std::string target = "/v1/models?" + std::string(2000, 'q');
  for (const std::string& request :
       {absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: x\r\n\r\n"),
        absl::StrCat("GET ", target, std::string(20000, 'q'))}) {
    const int fd = Connect(gateway->port());
    SendAll(fd, request);
    bool closed = false;
    const std::string answer = ReadUntilClose(fd, 3000, &closed);
    close(fd);
    ExpectRefusal(answer, closed, 414);
  }
}

// One huge header line (200 MiB offered) and too many header fields: 431,
// with memory bounded by the header limit.
TEST_F(HttpLimitsTest, HeaderOverTheLimitsIs431) {
  auto gateway = Start({"--max_header_bytes=16384", "--max_headers=100"});
  ASSERT_GT(gateway->port(), 0);
  ASSERT_EQ(Request(gateway->port(), "GET", "/health").first, 200);  // warm
  const long rss_before = gateway->RssKiB();
  {
    const int fd = Connect(gateway->port());
    SendAll(fd, "GET /health HTTP/1.1\r\nHost: x\r\nX-Huge: ");
    const std::string block(1 << 20, 'h');
    size_t sent = 0;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    while (sent < (size_t{200} << 20) && !Readable(fd, 0)) {
      const ssize_t n = send(fd, block.data(), block.size(), MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN) break;
      if (n < 0) Readable(fd, 10);
      if (n > 0) sent += n;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    bool closed = false;
    const std::string answer = ReadUntilClose(fd, 5000, &closed);
    close(fd);
    ExpectRefusal(answer, closed, 431);
    EXPECT_LT(sent, size_t{32} << 20);
  }
  EXPECT_LT(gateway->RssKiB() - rss_before, 8 * 1024);
  std::string many = "GET /health HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 150; ++i) absl::StrAppend(&many, "X-", i, ": 1\r\n");
  many += "\r\n";
  const int fd = Connect(gateway->port());
  SendAll(fd, many);
  bool closed = false;
  const std::string answer = ReadUntilClose(fd, 3000, &closed);
  close(fd);
  ExpectRefusal(answer, closed, 431);
}

// Malformed framing is answered 400 at once and closed; none holds a
// connection until a deadline.
TEST_F(HttpLimitsTest, MalformedFramingIs400AtOnce) {
  auto gateway =
      Start({"--header_timeout_ms=10000", "--body_timeout_ms=10000"});
  ASSERT_GT(gateway->port(), 0);
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"negative Content-Length", post + "Content-Length: -5\r\n\r\n"},
      {"huge Content-Length",
       post + "Content-Length: 99999999999999999999999999\r\n\r\n"},
      {"non-numeric Content-Length", post + "Content-Length: ten\r\n\r\n"},
      {"differing Content-Lengths",
       post + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello"},
      {"Content-Length and Transfer-Encoding",
       post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"},
      {"chunk size -5", post + "Transfer-Encoding: chunked\r\n\r\n-5\r\n"},
      {"chunk size not hex",
       post + "Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n"},
      {"chunk without its CRLF",
       post + "Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n"},
      {"unsupported Transfer-Encoding",
       post + "Transfer-Encoding: gzip\r\n\r\n"},
      {"bad request line", "GET\r\n\r\n"},
      {"bad header", "GET /health HTTP/1.1\r\nNo colon here\r\n\r\n"},
  };
  for (const auto& [name, request] : cases) {
    const int fd = Connect(gateway->port());
    const auto start = Clock::now();
    SendAll(fd, request);
    bool closed = false;
    const std::string answer = ReadUntilClose(fd, 3000, &closed);
    close(fd);
    SCOPED_TRACE(name);
    ExpectRefusal(answer, closed, 400);
    EXPECT_LT(SecondsSince(start), 1.0);
  }
}

// Requests written together are all answered, in order, on the connection.
TEST_F(HttpLimitsTest, PipelinedRequestsAreAnsweredInOrder) {
  auto gateway = Start();
  ASSERT_GT(gateway->port(), 0);
  std::string requests;
  for (int i = 0; i < 5; ++i) {
    requests += Post("/v1/completions",
                     CompletionBody(absl::StrCat("slow:request", i), 3 + i));
  }
  requests += "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  requests += "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  const int fd = Connect(gateway->port());
  ASSERT_TRUE(SendAll(fd, requests));
  bool closed = false;
  const std::string answer = ReadUntilClose(fd, 10000, &closed);
  close(fd);
  EXPECT_TRUE(closed);
  const std::vector<Response> responses = ParseResponses(answer);
  ASSERT_EQ(responses.size(), 7u) << answer;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(responses[i].status, 200) << responses[i].body;
    const json body = json::parse(responses[i].body, nullptr, false);
    ASSERT_FALSE(body.is_discarded()) << responses[i].body;
    EXPECT_EQ(body["choices"][0]["text"].get<std::string>().rfind(
                  absl::StrCat("slow:request", i), 0),
              0u)
        << responses[i].body;
  }
  EXPECT_EQ(responses[5].status, 200);
  EXPECT_NE(responses[5].body.find("\"status\":\"ok\""), std::string::npos);
  EXPECT_EQ(responses[6].status, 200);
  EXPECT_NE(responses[6].body.find("\"object\":\"list\""), std::string::npos);
}

// An idle keep-alive connection is closed after --keep_alive_timeout_s.
TEST_F(HttpLimitsTest, IdleKeepAliveConnectionsClose) {
  auto gateway = Start({"--keep_alive_timeout_s=1"});
  ASSERT_GT(gateway->port(), 0);
  const int fd = Connect(gateway->port());
  ASSERT_TRUE(SendAll(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_TRUE(Readable(fd, 3000));
  char buffer[4096];
  ASSERT_GT(recv(fd, buffer, sizeof(buffer), 0), 0);
  const auto start = Clock::now();
  bool closed = false;
  const std::string rest = ReadUntilClose(fd, 5000, &closed);
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_TRUE(rest.empty()) << rest;  // closed without an answer
  EXPECT_GE(SecondsSince(start), 0.8);
  EXPECT_LT(SecondsSince(start), 3.0);
}

// A body that does not arrive within --body_timeout_ms: 408 and close.
TEST_F(HttpLimitsTest, SlowBodyIs408) {
  auto gateway = Start({"--body_timeout_ms=1000"});
  ASSERT_GT(gateway->port(), 0);
  const int fd = Connect(gateway->port());
  const auto start = Clock::now();
  SendAll(fd,
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
          "Content-Length: 100\r\n\r\n{\"prompt\":");
  bool closed = false;
  const std::string answer = ReadUntilClose(fd, 5000, &closed);
  close(fd);
  ExpectRefusal(answer, closed, 408);
  EXPECT_GE(SecondsSince(start), 0.9);
  EXPECT_LT(SecondsSince(start), 3.0);
}

// A streaming client that stops reading is cut off at --write_timeout_s,
// and its router call is cancelled.
TEST_F(HttpLimitsTest, ClientThatStopsReadingIsCutOffAndCancelled) {
  auto gateway = Start({"--write_timeout_s=1"});
  ASSERT_GT(gateway->port(), 0);
  const int cancelled_before = router_->cancelled();
  const int fd = Connect(gateway->port());
  const int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  ASSERT_TRUE(SendAll(
      fd, Post("/v1/completions", CompletionBody("big:x", 20000, true))));
  // Never read: the socket buffers fill, the gateway's write waits, then
  // times out.
  const auto start = Clock::now();
  while (router_->cancelled() == cancelled_before && SecondsSince(start) < 15) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GT(router_->cancelled(), cancelled_before);
  EXPECT_LT(SecondsSince(start), 10.0);
  close(fd);
  EXPECT_EQ(Request(gateway->port(), "GET", "/health").first, 200);
}

// A client that leaves while its non-streamed completion runs cancels the
// router call.
TEST_F(HttpLimitsTest, ClientThatLeavesANonStreamedRequestCancelsIt) {
  auto gateway = Start();
  ASSERT_GT(gateway->port(), 0);
  const int cancelled_before = router_->cancelled();
  const int fd = Connect(gateway->port());
  ASSERT_TRUE(
      SendAll(fd, Post("/v1/completions", CompletionBody("slow:x", 500))));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  close(fd);
  const auto start = Clock::now();
  while (router_->cancelled() == cancelled_before && SecondsSince(start) < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(router_->cancelled(), cancelled_before);
}

// Bytes that are not UTF-8, in a path or a body, are answered (their error
// messages quote them as U+FFFD); they once ended the process.
TEST_F(HttpLimitsTest, InvalidUtf8IsAnsweredNotFatal) {
  auto gateway = Start();
  ASSERT_GT(gateway->port(), 0);
  const std::string bad = "\xff\xfe";
  for (const auto& [request, status] : std::vector<std::pair<std::string, int>>{
           {"GET /" + bad + " HTTP/1.1\r\nHost: x\r\n\r\n", 404},
           {Post("/v1/completions", "{\"prompt\": \"" + bad + "\"}"), 400},
           {Post("/v1/completions", "{\"" + bad + "\": 1}"), 400}}) {
    const int fd = Connect(gateway->port());
    SendAll(fd, request);
    ASSERT_TRUE(Readable(fd, 5000));
    char buffer[4096];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    close(fd);
    ASSERT_GT(n, 0) << request;
    EXPECT_EQ(StatusOf(std::string(buffer, n)), status) << request;
  }
  EXPECT_EQ(Request(gateway->port(), "GET", "/health").first, 200);
}

// Inconsistent limits are refused at startup.
TEST_F(HttpLimitsTest, InconsistentLimitsAreRefusedAtStartup) {
  for (const char* flag :
       {"--max_request_line_bytes=32768", "--max_header_bytes=100",
        "--header_timeout_ms=0", "--max_connections_per_client=2000",
        "--io_threads=0", "--max_body_bytes=-1"}) {
    // `timeout` ends a gateway that wrongly starts (its status 124).
    const std::string command =
        absl::StrCat("timeout 10 ", DEDIT_OPENAI_BINARY,
                     " --host=127.0.0.1 --port=0 ", flag, " 2>/dev/null");
    const int rc = std::system(command.c_str());
    ASSERT_TRUE(WIFEXITED(rc)) << flag;
    EXPECT_NE(WEXITSTATUS(rc), 0) << flag;
    EXPECT_NE(WEXITSTATUS(rc), 124) << flag << " was accepted";
  }
}

}  // namespace
}  // namespace dedit
