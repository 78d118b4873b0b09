#include "tests/services/service_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/serving/server_bootstrap.h"
#include "tests/model/test_util.h"

namespace dedit::testing {

int64_t ProcStatusValue(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  const std::string key = field + ":";
  std::string word;
  while (status >> word) {
    if (word == key) {
      int64_t value = -1;
      status >> value;
      return value;
    }
  }
  return -1;
}
namespace {

bool ReadPorts(const std::string& path, int* grpc_port, int* metrics_port,
               int* health_port) {
  std::ifstream in(path);
  if (!in) return false;
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  const size_t health = text.find("\"health_port\": ");
  if (health != std::string::npos) {
    std::sscanf(text.c_str() + health, "\"health_port\": %d", health_port);
  }
  return std::sscanf(text.c_str(), "{\"grpc_port\": %d, \"metrics_port\": %d",
                     grpc_port, metrics_port) == 2;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServiceProcess>> ServiceProcess::Start(
    const std::string& binary, std::vector<std::string> args,
    const std::string& work_dir, const std::string& name, int timeout_ms) {
  static int counter = 0;
  const std::string tag = absl::StrCat(name, "_", ++counter);
  const std::string ready = absl::StrCat(work_dir, "/", tag, ".ready");
  auto p = std::unique_ptr<ServiceProcess>(new ServiceProcess);
  p->log_path_ = absl::StrCat(work_dir, "/", tag, ".log");
  args.push_back("--ready_file=" + ready);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    // Die with the test binary, even if it aborts.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd =
        open(p->log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    // The test binary may block signals; the child must not inherit that.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  p->pid_ = pid;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ReadPorts(ready, &p->grpc_port_, &p->metrics_port_, &p->health_port_)) {
      return p;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      p->pid_ = -1;
      std::ifstream log(p->log_path_);
      std::stringstream s;
      s << log.rdbuf();
      return absl::InternalError(
          absl::StrCat(name, " exited during startup: ", s.str()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(name + " did not become ready");
}

ServiceProcess::~ServiceProcess() { Kill(); }

void ServiceProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

int ServiceProcess::Terminate(int timeout_ms) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

ServiceCluster::ServiceCluster() : ServiceCluster(Options()) {}

namespace {

TinyModelSpec ServiceTestSpec() {
  TinyModelSpec spec = DefaultTinySpec();
  // Room for the test tokenizer's ids (tiny_gpt2.json: 308 entries), so
  // that text prompts encode and most generated ids decode.
  spec.target.vocab_size = 320;
  spec.target.eos_token_ids = {};
  spec.drafter.layers = spec.target;
  spec.drafter.layers.num_hidden_layers = 2;
  spec.drafter.mask_token_id = spec.target.vocab_size - 1;
  return spec;
}

std::vector<std::string> DrafterArgs(const std::string& drafter_dir,
                                     const std::string& target_dir, int port) {
  return {"--drafter_dir=" + drafter_dir,
          "--target_dir=" + target_dir,
          "--host=127.0.0.1",
          absl::StrCat("--port=", port),
          "--metrics_port=0",
          "--threads=1",
          "--drain_timeout_ms=1000"};
}

std::vector<std::string> TargetArgs(const std::string& target_dir,
                                    const std::string& drafter_dir, int port) {
  return {"--target_dir=" + target_dir, "--drafter_dir=" + drafter_dir,
          "--host=127.0.0.1",           absl::StrCat("--port=", port),
          "--metrics_port=0",           "--threads=1",
          "--drain_timeout_ms=1000"};
}

}  // namespace

ServiceCluster::ServiceCluster(Options options)
    : options_(std::move(options)), spec_(ServiceTestSpec()) {
  spec_.drafter.lookup_seed_ngram = options_.drafter_lookup_seed_ngram;
}

ServiceCluster::~ServiceCluster() {
  router_.reset();
  target_.reset();
  drafter_.reset();
}

absl::Status ServiceCluster::Start() {
  dir_ = MakeTempDir();
  RETURN_IF_ERROR(WriteRandomQwen3(target_dir(), spec_.target, 7));
  RETURN_IF_ERROR(WriteRandomDrafter(drafter_dir(), spec_.drafter, 8));
  if (options_.with_tokenizer) {
    std::filesystem::copy_file(std::string(DEDIT_SOURCE_DIR) +
                                   "/tests/tokenizer/testdata/tiny_gpt2.json",
                               tokenizer_path());
  }
  if (options_.with_drafter) RETURN_IF_ERROR(StartDrafter(0));
  std::vector<std::string> targs = TargetArgs(target_dir(), drafter_dir(), 0);
  if (options_.with_drafter) {
    targs.push_back(absl::StrCat("--drafter=127.0.0.1:", drafter_port_));
  }
  for (const std::string& f : options_.target_flags) targs.push_back(f);
  ASSIGN_OR_RETURN(target_, ServiceProcess::Start(DEDIT_TARGET_BINARY, targs,
                                                  dir_, "target"));
  std::vector<std::string> rargs = {
      absl::StrCat("--target=127.0.0.1:", target_->grpc_port()),
      "--host=127.0.0.1", "--port=0", "--metrics_port=0",
      "--drain_timeout_ms=2000"};
  if (options_.with_drafter) {
    rargs.push_back(absl::StrCat("--drafter=127.0.0.1:", drafter_port_));
  }
  if (options_.with_tokenizer)
    rargs.push_back("--tokenizer=" + tokenizer_path());
  for (const std::string& f : options_.router_flags) rargs.push_back(f);
  ASSIGN_OR_RETURN(router_, ServiceProcess::Start(DEDIT_ROUTER_BINARY, rargs,
                                                  dir_, "router"));
  return absl::OkStatus();
}

absl::Status ServiceCluster::StartDrafter(int port) {
  std::vector<std::string> args =
      DrafterArgs(drafter_dir(), target_dir(), port);
  for (const std::string& f : options_.drafter_flags) args.push_back(f);
  ASSIGN_OR_RETURN(drafter_, ServiceProcess::Start(DEDIT_DRAFTER_BINARY, args,
                                                   dir_, "drafter"));
  drafter_port_ = drafter_->grpc_port();
  return absl::OkStatus();
}

std::string ServiceCluster::router_address() const {
  return absl::StrCat("127.0.0.1:", router_->grpc_port());
}

std::shared_ptr<grpc::Channel> ServiceCluster::RouterChannel() const {
  return grpc::CreateChannel(router_address(),
                             grpc::InsecureChannelCredentials());
}

std::shared_ptr<grpc::Channel> ServiceCluster::TargetChannel() const {
  return grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", target_->grpc_port()),
      grpc::InsecureChannelCredentials(), InternalChannelArguments());
}

std::shared_ptr<grpc::Channel> ServiceCluster::DrafterChannel() const {
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", drafter_port_),
                                   grpc::InsecureChannelCredentials(),
                                   InternalChannelArguments());
}

void ServiceCluster::KillDrafter() {
  if (drafter_) drafter_->Kill();
}

absl::Status ServiceCluster::RestartDrafter() {
  // The port was freed by the kill; SO_REUSEADDR lets the new process bind
  // it right away.
  return StartDrafter(drafter_port_);
}

void ServiceCluster::KillTarget() {
  if (target_) target_->Kill();
}

absl::StatusOr<std::string> ServiceCluster::Scrape(int metrics_port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(metrics_port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError("cannot connect to the metrics port");
  }
  const std::string request =
      "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n";
  if (write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("write failed");
  }
  std::string response;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.compare(0, 12, "HTTP/1.1 200") != 0 &&
      response.compare(0, 12, "HTTP/1.0 200") != 0) {
    return absl::UnavailableError("metrics: " + response.substr(0, 40));
  }
  return body == std::string::npos ? "" : response.substr(body + 4);
}

double ServiceCluster::MetricValue(const std::string& text,
                                   const std::string& name,
                                   const std::string& label) {
  double sum = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.compare(0, name.size(), name) != 0) continue;
    if (line.size() <= name.size() ||
        (line[name.size()] != '{' && line[name.size()] != ' ')) {
      continue;
    }
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    const size_t space = line.rfind(' ');
    sum += std::stod(line.substr(space + 1));
  }
  return sum;
}

StackCluster::StackCluster(Options options)
    : options_(std::move(options)), spec_(ServiceTestSpec()) {}

StackCluster::~StackCluster() {
  routers_.clear();
  stacks_.clear();
}

std::string StackCluster::StackName(int i) { return absl::StrCat("s", i); }

absl::Status StackCluster::Start() {
  dir_ = MakeTempDir();
  RETURN_IF_ERROR(WriteRandomQwen3(target_dir(), spec_.target, 7));
  RETURN_IF_ERROR(WriteRandomDrafter(drafter_dir(), spec_.drafter, 8));
  std::filesystem::copy_file(std::string(DEDIT_SOURCE_DIR) +
                                 "/tests/tokenizer/testdata/tiny_gpt2.json",
                             target_dir() + "/tokenizer.json");
  stacks_.resize(options_.stacks);
  std::vector<int> all;
  for (int i = 0; i < options_.stacks; ++i) {
    RETURN_IF_ERROR(StartStack(i));
    all.push_back(i);
  }
  RETURN_IF_ERROR(WriteStacksFile(all));
  for (int r = 0; r < options_.routers; ++r) {
    std::vector<std::string> args = {
        "--stacks_file=" + dir_ + "/stacks.txt",
        "--stacks_refresh_ms=100",
        "--tokenizer=" + target_dir() + "/tokenizer.json",
        "--host=127.0.0.1",
        "--port=0",
        "--metrics_port=0",
        "--drain_timeout_ms=2000"};
    for (const std::string& f : options_.router_flags) args.push_back(f);
    ASSIGN_OR_RETURN(auto router, ServiceProcess::Start(DEDIT_ROUTER_BINARY,
                                                        args, dir_, "router"));
    routers_.push_back(std::move(router));
  }
  return absl::OkStatus();
}

absl::Status StackCluster::StartStack(int i) {
  Stack& s = stacks_[i];
  // Like the pod: the drafter first, then the target streaming to it.
  ASSIGN_OR_RETURN(s.drafter,
                   ServiceProcess::Start(
                       DEDIT_DRAFTER_BINARY,
                       DrafterArgs(drafter_dir(), target_dir(), s.drafter_port),
                       dir_, absl::StrCat("drafter_", StackName(i))));
  s.drafter_port = s.drafter->grpc_port();
  return StartTarget(i);
}

absl::Status StackCluster::StartTarget(int i) {
  Stack& s = stacks_[i];
  std::vector<std::string> targs =
      TargetArgs(target_dir(), drafter_dir(), s.target_port);
  targs.push_back(absl::StrCat("--drafter=127.0.0.1:", s.drafter_port));
  for (const std::string& f : options_.target_flags) targs.push_back(f);
  ASSIGN_OR_RETURN(
      s.target, ServiceProcess::Start(DEDIT_TARGET_BINARY, targs, dir_,
                                      absl::StrCat("target_", StackName(i))));
  s.target_port = s.target->grpc_port();
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> StackCluster::RouterChannel(int router) const {
  return grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", routers_[router]->grpc_port()),
      grpc::InsecureChannelCredentials());
}

void StackCluster::KillStack(int i) {
  stacks_[i].target->Kill();
  stacks_[i].drafter->Kill();
}

absl::Status StackCluster::RestartStack(int i) { return StartStack(i); }

void StackCluster::KillTarget(int i) { stacks_[i].target->Kill(); }

absl::Status StackCluster::RestartTarget(int i) { return StartTarget(i); }

std::shared_ptr<grpc::Channel> StackCluster::TargetChannel(int i) const {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", stacks_[i].target_port),
                             grpc::InsecureChannelCredentials());
}

std::shared_ptr<grpc::Channel> StackCluster::DrafterChannel(int i) const {
  return grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", stacks_[i].drafter_port),
      grpc::InsecureChannelCredentials());
}

absl::Status StackCluster::WriteStacksFile(const std::vector<int>& stacks) {
  std::string text = "# name target drafter\n";
  for (int i : stacks) {
    absl::StrAppend(&text, StackName(i), " 127.0.0.1:", stacks_[i].target_port,
                    " 127.0.0.1:", stacks_[i].drafter_port, "\n");
  }
  const std::string path = dir_ + "/stacks.txt";
  {
    std::ofstream out(path + ".tmp");
    out << text;
    if (!out) return absl::InternalError("cannot write the stacks file");
  }
  std::filesystem::rename(path + ".tmp", path);
  return absl::OkStatus();
}

}  // namespace dedit::testing
