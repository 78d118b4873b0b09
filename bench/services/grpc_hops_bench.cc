// dedit-grpc-hops-bench: what the thread hand-offs of a target round cost,
// without a model. A server answers dedit.v1.Target.Step after busy-working
// --work_us (a forward's stand-in) in one of the shapes below, and a client in
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
//   stream_sync       the stream served by gRPC's synchronous API: the
//                     handler thread reads, works and writes (no hand-off);
//   stream_sync_handoff, stream_sync_spin
//                     the sync handler reads and queues the request for the
//                     model thread (sleeping, or polling --spin_us), which
//                     works and writes; the handler then reads the next;
//   stream_async_poll the model thread itself reads, works and writes on an
//                     async service's completion queue: no gRPC thread and
//                     no hand-off on the round's path.
//   stream_async_spin the same, with the model thread polling the queue
//                     (zero-deadline AsyncNext) for --spin_us before it
//                     blocks.
//
// --client_spin_us N: the client's streamed rounds go on an async stream
// whose completion queue the calling thread polls for N µs before it
// blocks (as common/serving/round_stream.h's client does, plus the poll);
// --client_sleep_us S first sleeps S µs (timer slack set to 1 µs), so that
// only the round's tail is polled.
//
//   dedit-grpc-hops-bench [--calls 2000] [--work_us 600] [--spin_us 500]
//                         [--transports tcp,unix]
//
// Each shape is timed over each transport: loopback TCP (what the services
// use between pods) and a Unix domain socket (gRPC's "unix:" addresses;
// services that share a node or a pod can use it). Prints one JSON line per
// shape and transport: the median and p90 round trip in µs, and the median
// less the work (what the services add per round). What the figures showed:
// docs/log/2026-12-06-bench-notebook.md, "What a services round's hops cost,
// and the async completion queue" and "Hop shapes".
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/prctl.h>
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
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/spin_wait.h"
#include "dedit/v1/services.grpc.pb.h"
#include "hops_bench.grpc.pb.h"

ABSL_FLAG(int, calls, 2000, "timed calls per shape (after 100 untimed)");
ABSL_FLAG(int, work_us, 600, "busy work per call, µs (a forward)");
ABSL_FLAG(int, spin_us, 500, "the model thread's idle poll in callback_spin");
ABSL_FLAG(std::string, shapes,
          "callback_inline,callback_handoff,callback_spin,async_poll,"
          "stream_inline,stream_handoff,stream_spin,stream_sync,"
          "stream_sync_handoff,stream_sync_spin,stream_async_poll,"
          "stream_async_spin",
          "server shapes to time, in order");
ABSL_FLAG(std::string, transports, "tcp,unix",
          "transports to time each shape over: tcp (loopback), unix");
ABSL_FLAG(int, client_sleep_us, 0,
          "with --client_spin_us: the client sleeps this long after sending "
          "a round before it polls (the poll covers only the round's tail)");
ABSL_FLAG(int, client_spin_us, 0,
          "streamed shapes: the client polls its completion queue this "
          "long before it blocks (0: the synchronous stream API)");
ABSL_FLAG(bool, with_callback_service, false,
          "stream_async_*: register an idle callback service beside it");
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

// The stream on gRPC's synchronous API: the handler thread reads; it
// works and writes itself, or queues the request for the model thread,
// which works and writes while the handler waits to read the next.
class SyncStreamTarget final : public HopsBench::Service {
 public:
  SyncStreamTarget(int work_us, ModelThread* model)
      : work_us_(work_us), model_(model) {}
  grpc::Status StepStream(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<StepResponse, StepRequest>* stream) override {
    StepRequest request;
    StepResponse response;
    while (stream->Read(&request)) {
      response.Clear();
      if (model_ == nullptr) {
        Work(work_us_);
        Answer(&response);
        if (!stream->Write(response)) break;
        continue;
      }
      absl::Mutex mu;
      bool done = false;
      bool wrote = false;
      model_->Queue([&] {
        Answer(&response);
        const bool ok = stream->Write(response);
        absl::MutexLock lock(&mu);
        wrote = ok;
        done = true;
      });
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(&done));
      if (!wrote) break;
    }
    return grpc::Status::OK;
  }

 private:
  const int work_us_;
  ModelThread* const model_;
};

// The next event of `cq`: polled for `spin` first, then waited for.
bool NextEvent(grpc::CompletionQueue* cq, absl::Duration spin) {
  void* tag;
  bool ok;
  const absl::Time until = absl::Now() + spin;
  while (absl::Now() < until) {
    const auto next = cq->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
    if (next == grpc::CompletionQueue::GOT_EVENT) return ok;
    if (next == grpc::CompletionQueue::SHUTDOWN) std::_Exit(1);
  }
  if (!cq->Next(&tag, &ok)) std::_Exit(1);
  return ok;
}

// One stream at a time, served by the thread that polls the completion
// queue: read, work, write, read the next.
[[noreturn]] void ServeStreamAsyncPoll(grpc::ServerBuilder& builder,
                                       int work_us, absl::Duration spin) {
  HopsBench::AsyncService service;
  builder.RegisterService(&service);
  // An idle callback service beside it, as a real target serves its other
  // calls (its threads poll too).
  CallbackTarget callbacks(work_us, nullptr);
  if (absl::GetFlag(FLAGS_with_callback_service)) {
    builder.RegisterService(&callbacks);
  }
  std::unique_ptr<grpc::ServerCompletionQueue> cq =
      builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  void* tag;
  bool ok;
  for (;;) {
    grpc::ServerContext context;
    grpc::ServerAsyncReaderWriter<StepResponse, StepRequest> stream(&context);
    service.RequestStepStream(&context, &stream, cq.get(), cq.get(),
                              reinterpret_cast<void*>(1));
    if (!cq->Next(&tag, &ok)) std::_Exit(1);
    StepRequest request;
    StepResponse response;
    for (;;) {
      stream.Read(&request, reinterpret_cast<void*>(2));
      if (!NextEvent(cq.get(), spin)) break;
      Work(work_us);
      response.Clear();
      Answer(&response);
      stream.Write(response, reinterpret_cast<void*>(3));
      if (!NextEvent(cq.get(), absl::ZeroDuration())) break;
    }
    stream.Finish(grpc::Status::OK, reinterpret_cast<void*>(4));
    if (!cq->Next(&tag, &ok)) std::_Exit(1);
  }
}

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
  if (shape == "stream_async_poll") {
    ServeStreamAsyncPoll(builder, work_us, absl::ZeroDuration());
  }
  if (shape == "stream_async_spin") {
    ServeStreamAsyncPoll(builder, work_us, absl::Microseconds(spin_us));
  }
  std::unique_ptr<ModelThread> model;
  if (shape != "callback_inline" && shape != "stream_inline" &&
      shape != "stream_sync") {
    const bool spin = shape == "callback_spin" || shape == "stream_spin" ||
                      shape == "stream_sync_spin";
    model = std::make_unique<ModelThread>(work_us, spin ? spin_us : 0);
  }
  if (shape.rfind("stream_sync", 0) == 0) {
    SyncStreamTarget sync_service(work_us, model.get());
    builder.RegisterService(&sync_service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    server->Wait();
    std::_Exit(0);
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
  std::vector<std::string> args = {"dedit-grpc-hops-bench",
                                   "--serve=" + shape,
                                   "--address=" + address,
                                   "--work_us=" + std::to_string(work_us),
                                   "--spin_us=" + std::to_string(spin_us),
                                   absl::GetFlag(FLAGS_with_callback_service)
                                       ? "--with_callback_service"
                                       : "--nowith_callback_service"};
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
    const absl::Duration client_spin =
        absl::Microseconds(absl::GetFlag(FLAGS_client_spin_us));
    grpc::CompletionQueue client_cq;
    std::unique_ptr<grpc::ClientAsyncReaderWriter<StepRequest, StepResponse>>
        async_stream;
    if (streamed && client_spin > absl::ZeroDuration()) {
      async_stream = stream_stub->AsyncStepStream(&stream_context, &client_cq,
                                                  reinterpret_cast<void*>(1));
      NextEvent(&client_cq, absl::ZeroDuration());
    } else if (streamed) {
      stream = stream_stub->StepStream(&stream_context);
    }
    for (int i = 0; i < calls + 100; ++i) {
      grpc::ClientContext context;
      StepResponse response;
      const auto t0 = Clock::now();
      grpc::Status status;
      if (async_stream != nullptr) {
        async_stream->Write(request, reinterpret_cast<void*>(2));
        async_stream->Read(&response, reinterpret_cast<void*>(3));
        if (absl::GetFlag(FLAGS_client_sleep_us) > 0) {
          static const int slack = prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0);
          (void)slack;
          absl::SleepFor(
              absl::Microseconds(absl::GetFlag(FLAGS_client_sleep_us)));
        }
        const bool first = NextEvent(&client_cq, client_spin);
        if (!NextEvent(&client_cq, client_spin) || !first) {
          status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broke");
        }
      } else if (streamed) {
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
    if (async_stream != nullptr) {
      stream_context.TryCancel();
      client_cq.Shutdown();
      void* tag;
      bool ok;
      while (client_cq.Next(&tag, &ok)) {
      }
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
