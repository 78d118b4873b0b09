// Rounds on one long-lived bidirectional stream: Target.Rounds and
// Drafter.Rounds (docs/SERVICES.md "Round streams"). One request in, one
// response out, in order; the response carries the round's status in its
// `code` and `message` fields, so a failed round ends no stream.
//
// Why: a unary call per round sets up a call each time (a HEADERS frame
// with the method and deadline, trailers, call objects on both sides); a
// stream pays that once, and a speculative round makes two hops (Step,
// Draft). bench/README.md, "A long-lived stream instead of a unary call per
// round", measures the difference.
//
// Server side: RoundStreamReactor hands each request to a handler whose
// `done` may run on any thread (the model thread), writes the response,
// then reads the next request. RoundStreams tracks a service's streams so
// that a drain finishes each one at its next idle moment.
//
// Client side: RoundStreamClient owns one stream and a completion queue
// that the calling thread polls itself (no hand-off to a gRPC thread, as a
// synchronous call), with the per-round deadline a unary call would carry:
// a round past it cancels the stream and is DEADLINE_EXCEEDED. A broken
// stream is reopened by the next round.
#ifndef DEDIT_SERVING_ROUND_STREAM_H_
#define DEDIT_SERVING_ROUND_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "proto/grpc_status.h"

namespace dedit {

class RoundStreamBase {
 public:
  virtual ~RoundStreamBase() = default;
  // Finishes the stream UNAVAILABLE now if it waits for a request, else
  // after the round in flight is written.
  virtual void Drain() = 0;
};

// A service's open round streams.
class RoundStreams {
 public:
  // Every open stream finishes at its next idle moment; streams opened
  // later are refused UNAVAILABLE.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);
  int size() const ABSL_LOCKS_EXCLUDED(mu_);

  // For RoundStreamReactor: false once draining.
  bool Attach(RoundStreamBase* stream) ABSL_LOCKS_EXCLUDED(mu_);
  void Detach(RoundStreamBase* stream) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  std::set<RoundStreamBase*> streams_ ABSL_GUARDED_BY(mu_);
};

// The message the service gives a drained or refused stream.
absl::Status RoundStreamDrainingError();

template <class Request, class Response>
class RoundStreamReactor final
    : public grpc::ServerBidiReactor<Request, Response>,
      public RoundStreamBase {
 public:
  using Done = std::function<void(absl::Status)>;
  // Handles one round: fills the response, then calls `done` once with the
  // round's status, on any thread. The request is valid until `done`.
  using Handler = std::function<void(const Request&, Response*, Done)>;

  RoundStreamReactor(RoundStreams* streams, Handler handle)
      : streams_(streams), handle_(std::move(handle)) {
    attached_ = streams_->Attach(this);
    // A Drain that came since Attach left the stream to this check
    // (`reading_` was still false).
    absl::MutexLock lock(&mu_);
    if (!attached_ || draining_) {
      finished_ = true;
      this->Finish(ToGrpcStatus(RoundStreamDrainingError()));
      return;
    }
    reading_ = true;
    this->StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;  // drained while waiting for this request
      if (!ok) {
        finished_ = true;  // the client closed or cancelled the stream
      } else {
        reading_ = false;
      }
    }
    if (!ok) {
      this->Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    handle_(request_, &response_, [this](absl::Status status) {
      response_.set_code(static_cast<int>(status.code()));
      response_.set_message(std::string(status.message()));
      this->StartWrite(&response_);
    });
  }

  void OnWriteDone(bool ok) override {
    grpc::Status finish;
    {
      absl::MutexLock lock(&mu_);
      if (ok && !draining_) {
        reading_ = true;
        // Under the lock, so that Drain never finishes the stream between
        // the state change and the read (gRPC never runs OnReadDone inline
        // in StartRead).
        this->StartRead(&request_);
        return;
      }
      finished_ = true;
      finish = ok ? ToGrpcStatus(RoundStreamDrainingError())
                  : grpc::Status(grpc::StatusCode::CANCELLED,
                                 "round stream closed by the client");
    }
    this->Finish(std::move(finish));
  }

  void Drain() override {
    {
      absl::MutexLock lock(&mu_);
      draining_ = true;
      if (finished_ || !reading_) return;  // OnWriteDone finishes it
      finished_ = true;
    }
    // gRPC never runs OnDone inline in Finish, so `this` outlives the call.
    this->Finish(ToGrpcStatus(RoundStreamDrainingError()));
  }

  void OnDone() override {
    if (attached_) streams_->Detach(this);
    delete this;
  }

 private:
  RoundStreams* const streams_;
  const Handler handle_;
  Request request_;
  Response response_;
  absl::Mutex mu_;
  bool attached_ = false;                      // set in the constructor only
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // a read is outstanding
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// One client's stream of rounds. Thread-safe; rounds are serialised.
template <class Request, class Response>
class RoundStreamClient {
 public:
  using Clock = std::chrono::system_clock;
  using Stream = grpc::ClientAsyncReaderWriter<Request, Response>;
  // Opens a stream (a stub's PrepareAsyncRounds): not started.
  using Open = std::function<std::unique_ptr<Stream>(grpc::ClientContext*,
                                                     grpc::CompletionQueue*)>;

  // `on_open` (may be empty) runs each time a stream is opened: the first
  // round's and every reopening's (a metric of stream churn).
  explicit RoundStreamClient(Open open, std::function<void()> on_open = {})
      : open_(std::move(open)), on_open_(std::move(on_open)) {}
  RoundStreamClient(const RoundStreamClient&) = delete;
  RoundStreamClient& operator=(const RoundStreamClient&) = delete;

  ~RoundStreamClient() {
    {
      absl::MutexLock lock(&mu_);
      if (stream_ != nullptr) Close(/*cancel=*/true).IgnoreError();
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  // Sends one round and reads its response; returns the round's status,
  // as a unary call would: the response's `code` and `message` (a failed
  // round keeps the stream), or a transport failure (the service down,
  // draining, the stream broken) as the stream's status, or a round past
  // `deadline` as DEADLINE_EXCEEDED. A transport failure closes the
  // stream, and the next round opens a new one.
  absl::Status Call(const Request& request, Response* response,
                    Clock::time_point deadline) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    for (int attempt = 0;; ++attempt) {
      const bool fresh = stream_ == nullptr;
      if (fresh) {
        stream_ = std::make_unique<OpenStream>();
        // The call's headers go out with its first message: one send, and
        // StartCall completes no tag (it performs no operation).
        stream_->context.set_initial_metadata_corked(true);
        stream_->rw = open_(&stream_->context, &cq_);
        stream_->rw->StartCall(nullptr);
        if (on_open_) on_open_();
      }
      stream_->rw->Write(request, Tag(kWrite));
      stream_->rw->Read(response, Tag(kRead));
      pending_ += 2;
      bool write_ok = true;
      bool read_ok = true;
      bool read_done = false;
      bool write_done = false;
      while (!(read_done && write_done)) {
        void* tag;
        bool ok;
        const grpc::CompletionQueue::NextStatus next =
            cq_.AsyncNext(&tag, &ok, deadline);
        if (next != grpc::CompletionQueue::GOT_EVENT) {
          Close(/*cancel=*/true).IgnoreError();  // CANCELLED, by us
          return absl::DeadlineExceededError(
              "round deadline exceeded on the round stream");
        }
        --pending_;
        if (tag == Tag(kWrite)) {
          write_done = true;
          write_ok = ok;
        } else if (tag == Tag(kRead)) {
          read_done = true;
          read_ok = ok;
        }
      }
      if (write_ok && read_ok) {
        return StatusFromCode(response->code(), response->message());
      }
      const absl::Status broken = Close(/*cancel=*/false);
      // A stream that served earlier rounds may have ended between rounds
      // without this process noticing yet (the service restarted or
      // drained; nothing polls the queue between rounds), so the round is
      // sent once more on a new stream, as a unary call would have been.
      // Safe for the services' rounds: a Draft only reads, and a target
      // round that did arrive is refused the second time (a verify's start
      // no longer matches, a new sequence exists) or repeated to the same
      // effect (a continuation truncates to its start first).
      if (!fresh && attempt == 0) continue;
      return broken.ok() ? absl::UnavailableError("round stream ended")
                         : broken;
    }
  }

 private:
  enum TagKind { kWrite, kRead, kFinish };
  struct OpenStream {
    grpc::ClientContext context;
    std::unique_ptr<Stream> rw;
  };
  void* Tag(TagKind kind) { return &tags_[kind]; }

  // Ends the stream (cancelling it first if asked), collects its pending
  // operations and returns its final status.
  absl::Status Close(bool cancel) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancel) stream_->context.TryCancel();
    void* tag;
    bool ok;
    while (pending_ > 0 && cq_.Next(&tag, &ok)) --pending_;
    grpc::Status status;
    stream_->rw->Finish(&status, Tag(kFinish));
    while (cq_.Next(&tag, &ok) && tag != Tag(kFinish)) {
    }
    stream_.reset();
    return FromGrpcStatus(status);
  }

  const Open open_;
  const std::function<void()> on_open_;
  absl::Mutex mu_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<OpenStream> stream_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  char tags_[3] = {};
};

}  // namespace dedit

#endif  // DEDIT_SERVING_ROUND_STREAM_H_
