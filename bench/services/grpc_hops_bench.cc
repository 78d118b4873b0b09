// dedit-grpc-hops-bench: what the thread hand-offs of a target round cost,
// without a model. A server answers dedit.v1.Target.Step after busy-working
// --work_us (a forward's stand-in) in one of four shapes, and a client in
// another process times sequential one-at-a-time calls, as the router's
// round loop makes them:
//
//   callback_inline   the callback handler works and Finishes on the gRPC
//                     thread (no hand-off; no real model thread could do
//                     this, since its state is single-threaded);
//   callback_handoff  the handler queues the call for a model thread that
//                     sleeps on an absl::Mutex between calls, works and
//                     Finishes (dedit-target's shape today);
//   callback_spin     the same with the model thread polling its queue for
//                     --spin_us before it sleeps (dedit-target
//                     --idle_spin_us);
//   async_poll        the model thread itself takes calls from an async
//                     service's completion queue, works and Finishes: no
//                     hand-off between a gRPC thread and the model thread.
//   stream_inline,    the same messages on one long-lived bidirectional
//   stream_handoff,   stream (hops_bench.proto), one request and one
//   stream_spin       response per round: the reactor works and writes on
//                     the gRPC thread, or hands each request to the model
//                     thread (sleeping, or polling --spin_us), which works
//                     and starts the write. No call is set up per round:
//                     no headers, trailers or call objects.
//
//   dedit-grpc-hops-bench [--calls 2000] [--work_us 600] [--spin_us 500]
//                         [--transports tcp,unix]
//
// Each shape is timed over each transport: loopback TCP (what the services
// use between pods) and a Unix domain socket (gRPC's "unix:" addresses;
// services that share a node or a pod can use it). Prints one JSON line per
// shape and transport: the median and p90 round trip in µs, and the median
// less the work (what the services add per round). The figures
// read in bench/README.md ("Where the services' round goes").
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/spin_wait.h"
#include "dedit/v1/services.grpc.pb.h"
#include "hops_bench.grpc.pb.h"

ABSL_FLAG(int, calls, 2000, "timed calls per shape (after 100 untimed)");
ABSL_FLAG(int, work_us, 600, "busy work per call, µs (a forward)");
ABSL_FLAG(int, spin_us, 500, "the model thread's idle poll in callback_spin");
ABSL_FLAG(std::string, shapes,
          "callback_inline,callback_handoff,callback_spin,async_poll,"
          "stream_inline,stream_handoff,stream_spin",
          "server shapes to time, in order");
ABSL_FLAG(std::string, transports, "tcp,unix",
          "transports to time each shape over: tcp (loopback), unix");
ABSL_FLAG(std::string, serve, "", "internal: run the server of this shape");
ABSL_FLAG(std::string, address, "", "internal: the server's address");

namespace {

using Clock = std::chrono::steady_clock;
using dedit::bench::HopsBench;
using dedit::v1::StepRequest;
using dedit::v1::StepResponse;
using dedit::v1::Target;

void Work(int us) {
  const auto until = Clock::now() + std::chrono::microseconds(us);
  while (Clock::now() < until) {
  }
}

void Answer(StepResponse* response) {
  response->mutable_verify()->add_results()->set_accepted(1);
}

// The model thread of the hand-off shapes: takes queued calls, works and
// answers them (`answer` fills the response and finishes or writes it),
// sleeping (after an optional poll) while there are none.
class ModelThread {
 public:
  ModelThread(int work_us, int spin_us)
      : work_us_(work_us), spin_(absl::Microseconds(spin_us)) {
    thread_ = std::thread([this] { Run(); });
  }
  void Queue(std::function<void()> answer) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(answer));
  }

 private:
  using Call = std::function<void()>;
  void Run() {
    for (;;) {
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty();
      };
      dedit::SpinUntilReady(mu_, spin_, ready);
      Call call;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(&ready));
        call = queue_.front();
        queue_.pop_front();
      }
      Work(work_us_);
      call();
    }
  }
  const int work_us_;
  const absl::Duration spin_;
  absl::Mutex mu_;
  std::deque<Call> queue_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

class CallbackTarget final : public Target::CallbackService {
 public:
  CallbackTarget(int work_us, ModelThread* model)
      : work_us_(work_us), model_(model) {}
  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* context,
                                 const StepRequest*,
                                 StepResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (model_ != nullptr) {
      model_->Queue([reactor, response] {
        Answer(response);
        reactor->Finish(grpc::Status::OK);
      });
    } else {
      Work(work_us_);
      Answer(response);
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }

 private:
  const int work_us_;
  ModelThread* model_;
};

// One bidirectional stream per client: read a request, work (inline or on
// the model thread), write the response, read the next.
class StreamTarget final : public HopsBench::CallbackService {
 public:
  StreamTarget(int work_us, ModelThread* model)
      : work_us_(work_us), model_(model) {}
  grpc::ServerBidiReactor<StepRequest, StepResponse>* StepStream(
      grpc::CallbackServerContext*) override {
    return new Reactor(work_us_, model_);
  }

 private:
  class Reactor final
      : public grpc::ServerBidiReactor<StepRequest, StepResponse> {
   public:
    Reactor(int work_us, ModelThread* model)
        : work_us_(work_us), model_(model) {
      StartRead(&request_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status::OK);
        return;
      }
      response_.Clear();
      if (model_ != nullptr) {
        model_->Queue([this] {
          Answer(&response_);
          StartWrite(&response_);
        });
      } else {
        Work(work_us_);
        Answer(&response_);
        StartWrite(&response_);
      }
    }
    void OnWriteDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status::OK);
        return;
      }
      StartRead(&request_);
    }
    void OnDone() override { delete this; }

   private:
    const int work_us_;
    ModelThread* const model_;
    StepRequest request_;
    StepResponse response_;
  };
  const int work_us_;
  ModelThread* model_;
};

[[noreturn]] void Serve(const std::string& shape, const std::string& address,
                        int work_us, int spin_us) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  if (shape == "async_poll") {
    Target::AsyncService service;
    builder.RegisterService(&service);
    std::unique_ptr<grpc::ServerCompletionQueue> cq =
        builder.AddCompletionQueue();
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    // One call in flight at a time, as a round loop makes them: request
    // the next call, wait for it, work, finish, wait for the finish.
    for (;;) {
      grpc::ServerContext context;
      StepRequest request;
      StepResponse response;
      grpc::ServerAsyncResponseWriter<StepResponse> writer(&context);
      service.RequestStep(&context, &request, &writer, cq.get(), cq.get(),
                          reinterpret_cast<void*>(1));
      void* tag;
      bool ok;
      if (!cq->Next(&tag, &ok)) std::_Exit(1);
      Work(work_us);
      Answer(&response);
      writer.Finish(response, grpc::Status::OK, reinterpret_cast<void*>(2));
      if (!cq->Next(&tag, &ok)) std::_Exit(1);
    }
  }
  std::unique_ptr<ModelThread> model;
  if (shape != "callback_inline" && shape != "stream_inline") {
    model = std::make_unique<ModelThread>(
        work_us,
        shape == "callback_spin" || shape == "stream_spin" ? spin_us : 0);
  }
  CallbackTarget service(work_us, model.get());
  StreamTarget stream_service(work_us, model.get());
  builder.RegisterService(&service);
  builder.RegisterService(&stream_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  server->Wait();
  std::_Exit(0);
}

// A port the kernel picks for a bound-then-closed socket (free for long
// enough to hand to the server), or 0.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

nlohmann::json TimeShape(const std::string& shape, const std::string& transport,
                         int calls, int work_us, int spin_us) {
  std::string address;
  std::string socket_dir;
  if (transport == "tcp") {
    address = "127.0.0.1:" + std::to_string(FreePort());
  } else if (transport == "unix") {
    char dir[] = "/tmp/dedit-hops-XXXXXX";
    if (mkdtemp(dir) == nullptr) {
      return {{"shape", shape},
              {"transport", transport},
              {"error", "mkdtemp failed"}};
    }
    socket_dir = dir;
    address = "unix:" + socket_dir + "/grpc.sock";
  } else {
    return {{"shape", shape},
            {"transport", transport},
            {"error", "unknown transport (tcp or unix)"}};
  }
  const std::string self = "/proc/self/exe";
  std::vector<std::string> args = {"dedit-grpc-hops-bench", "--serve=" + shape,
                                   "--address=" + address,
                                   "--work_us=" + std::to_string(work_us),
                                   "--spin_us=" + std::to_string(spin_us)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ) !=
      0) {
    return {{"shape", shape}, {"error", "spawn failed"}};
  }
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  std::unique_ptr<Target::Stub> stub = Target::NewStub(channel);
  nlohmann::json out = {
      {"shape", shape}, {"transport", transport}, {"work_us", work_us}};
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::seconds(10))) {
    out["error"] = "server did not start";
  } else {
    StepRequest request;
    request.mutable_verify()->add_items()->set_sequence(1);
    std::vector<double> us;
    // The streamed shapes: one stream for all the calls, opened untimed.
    const bool streamed = shape.rfind("stream_", 0) == 0;
    std::unique_ptr<HopsBench::Stub> stream_stub = HopsBench::NewStub(channel);
    grpc::ClientContext stream_context;
    std::unique_ptr<grpc::ClientReaderWriter<StepRequest, StepResponse>> stream;
    if (streamed) stream = stream_stub->StepStream(&stream_context);
    for (int i = 0; i < calls + 100; ++i) {
      grpc::ClientContext context;
      StepResponse response;
      const auto t0 = Clock::now();
      grpc::Status status;
      if (streamed) {
        if (!stream->Write(request) || !stream->Read(&response)) {
          status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broke");
        }
      } else {
        status = stub->Step(&context, request, &response);
      }
      const auto t1 = Clock::now();
      if (!status.ok()) {
        out["error"] = status.error_message();
        break;
      }
      if (i >= 100) {
        us.push_back(
            std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    }
    if (!us.empty()) {
      std::sort(us.begin(), us.end());
      const double median = us[us.size() / 2];
      out["median_us"] = median;
      out["p90_us"] = us[us.size() * 9 / 10];
      out["added_us"] = median - work_us;
    }
    if (stream != nullptr) {
      stream->WritesDone();
      stream->Finish();
    }
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  if (!socket_dir.empty()) {
    unlink((socket_dir + "/grpc.sock").c_str());
    rmdir(socket_dir.c_str());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int work_us = absl::GetFlag(FLAGS_work_us);
  const int spin_us = absl::GetFlag(FLAGS_spin_us);
  if (!absl::GetFlag(FLAGS_serve).empty()) {
    Serve(absl::GetFlag(FLAGS_serve), absl::GetFlag(FLAGS_address), work_us,
          spin_us);
  }
  // Transports alternate within each shape, so that a slow spell of the
  // machine falls on both.
  const std::vector<std::string> shapes =
      absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',', absl::SkipEmpty());
  const std::vector<std::string> transports =
      absl::StrSplit(absl::GetFlag(FLAGS_transports), ',', absl::SkipEmpty());
  for (const std::string& shape : shapes) {
    for (const std::string& transport : transports) {
      std::printf("%s\n",
                  TimeShape(shape, transport, absl::GetFlag(FLAGS_calls),
                            work_us, spin_us)
                      .dump()
                      .c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}
