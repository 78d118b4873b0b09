#include "target_service/context_stream_client.h"

#include <chrono>
#include <utility>

#include "absl/time/time.h"
#include "common/model/torch_status.h"
#include "proto/tensor_wire.h"

namespace dedit {

ContextStreamClient::ContextStreamClient(std::shared_ptr<grpc::Channel> channel,
                                         Options options,
                                         BytesObserver on_bytes_sent)
    : stub_(v1::Drafter::NewStub(channel)),
      options_(options),
      on_bytes_sent_(std::move(on_bytes_sent)) {}

ContextStreamClient::~ContextStreamClient() { Stop(0); }

void ContextStreamClient::Start() {
  thread_ = std::thread([this] { Run(); });
}

void ContextStreamClient::Stop(int drain_ms) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(drain_ms);
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      stop_deadline_ = deadline;
    }
    // Give the writer the drain time, then cut a call that is stuck (a
    // drafter that stopped reading blocks Write on flow control).
    auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return queue_.empty();
    };
    mu_.AwaitWithTimeout(absl::Condition(&drained),
                         absl::Milliseconds(drain_ms));
    // TryCancel never blocks; the lock keeps the writer from destroying the
    // call's context meanwhile.
    if (current_call_ != nullptr) current_call_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status ContextStreamClient::OnContext(SequenceId sequence, int64_t start,
                                            const at::Tensor& features) {
  Pending pending;
  pending.chunk.set_sequence(sequence);
  pending.chunk.set_start(start);
  pending.features = features;
  pending.bytes = features.numel() * 2;  // bf16
  Enqueue(std::move(pending));
  return absl::OkStatus();
}

void ContextStreamClient::OnRelease(SequenceId sequence) {
  Pending pending;
  pending.chunk.set_sequence(sequence);
  pending.chunk.set_release(true);
  Enqueue(std::move(pending));
}

void ContextStreamClient::Enqueue(Pending pending) {
  const int64_t bytes = pending.bytes;
  absl::MutexLock lock(&mu_);
  // Without a drafter to read them, chunks would only pile up; the drafter
  // drops sequences whose context has a gap anyway.
  if (stopping_ || !connected_.load() ||
      queued_bytes_ + bytes > options_.max_queued_bytes) {
    dropped_chunks_.fetch_add(1);
    return;
  }
  queued_bytes_ += bytes;
  queue_.push_back(std::move(pending));
}

void ContextStreamClient::Run() {
  while (true) {
    grpc::ClientContext context;
    // Fail fast while the drafter is down, instead of queueing the call.
    context.set_wait_for_ready(false);
    v1::StreamContextSummary summary;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      current_call_ = &context;
    }
    std::unique_ptr<grpc::ClientWriter<v1::ContextChunk>> writer =
        stub_->StreamContext(&context, &summary);
    // The drafter sends initial metadata as soon as it accepts the stream;
    // only then is it worth queueing context for it.
    writer->WaitForInitialMetadata();
    WriteLoop(writer.get());
    connected_.store(false);
    writer->WritesDone();
    (void)writer->Finish();
    absl::MutexLock lock(&mu_);
    current_call_ = nullptr;
    // Context queued for a broken call is lost with it.
    dropped_chunks_.fetch_add(static_cast<int64_t>(queue_.size()));
    queue_.clear();
    queued_bytes_ = 0;
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&stopping),
                         absl::Milliseconds(options_.reconnect_backoff_ms));
    if (stopping_) return;
  }
}

void ContextStreamClient::WriteLoop(
    grpc::ClientWriter<v1::ContextChunk>* writer) {
  // An empty first write tells whether the call is alive
  // (WaitForInitialMetadata returns on failure too).
  bool alive = writer->Write(v1::ContextChunk());
  connected_.store(alive);
  while (alive) {
    Pending pending;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty() ||
          (stopping_ && std::chrono::steady_clock::now() > stop_deadline_)) {
        return;
      }
      pending = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= pending.bytes;
    }
    v1::ContextChunk& chunk = pending.chunk;
    if (pending.features.defined()) {
      // bf16 on the wire (docs/ARCHITECTURE.md §3): half the bytes of f32.
      const absl::Status status = GuardTorch([&] {
        const at::Tensor cpu =
            pending.features.to(at::kCPU, at::kBFloat16).contiguous();
        SetWireTensor(WireDtype::kBFloat16, cpu.sizes().vec(), cpu.data_ptr(),
                      static_cast<size_t>(cpu.numel() * cpu.element_size()),
                      chunk.mutable_features());
      });
      pending.features = at::Tensor();
      if (!status.ok()) {
        // The drafter sees a gap and drops the sequence's context: speed
        // lost, never correctness.
        dropped_chunks_.fetch_add(1);
        continue;
      }
    }
    const int64_t bytes = static_cast<int64_t>(chunk.ByteSizeLong());
    alive = writer->Write(chunk);
    if (alive && on_bytes_sent_) on_bytes_sent_(bytes);
  }
}

}  // namespace dedit
