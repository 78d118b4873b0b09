#include "gateway/openai_server.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/serving/server_bootstrap.h"
#include "common/serving/shutdown_signals.h"
#include "dedit/v1/services.grpc.pb.h"
#include "gateway/connection_probe.h"
#include "gateway/generate_call.h"
#include "gateway/http_metrics.h"
#include "gateway/openai_request.h"
#include "gateway/openai_response.h"

namespace dedit {
namespace {

// How often a non-streamed request checks that its client is still there.
constexpr int kDisconnectCheckMs = 100;

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

void ReplyError(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  if (error.http_status == 429 || error.http_status == 503) {
    res.set_header("Retry-After", "1");
  }
  res.set_content(error.Body(), "application/json");
}

ApiError ServerError(int status, std::string message, std::string type,
                     std::string code) {
  ApiError e;
  e.http_status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

// When the request reached the handlers (cpp-httplib serves a connection on
// one thread, so the logger that ends the request runs on the same one).
thread_local std::optional<Clock::time_point> request_start;

class OpenAiFront {
 public:
  explicit OpenAiFront(const OpenAiServerOptions& options)
      : options_(options),
        stub_(v1::Generation::NewStub(grpc::CreateChannel(
            options.router_address, grpc::InsecureChannelCredentials()))),
        registry_(std::make_shared<prometheus::Registry>()),
        metrics_(*registry_),
        created_(std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count()) {}

  absl::Status Serve();

 private:
  // A completion request in flight: its concurrency slot and router call.
  // Registered so that the drain can cancel it.
  class Generation {
   public:
    Generation(OpenAiFront* front, bool stream, const v1::GenerateRequest& r)
        : front_(front),
          stream_(stream),
          call_(front->stub_.get(), r,
                std::chrono::system_clock::now() +
                    std::chrono::milliseconds(
                        front->options_.request_timeout_ms)) {
      front_->Register(&call_, stream_);
    }
    ~Generation() { front_->Unregister(&call_, stream_); }
    GenerateCall& call() { return call_; }

   private:
    OpenAiFront* const front_;
    const bool stream_;
    GenerateCall call_;
  };

  void Routes();
  void HandleGenerate(Endpoint endpoint, const httplib::Request& req,
                      httplib::Response& res);
  void Stream(std::unique_ptr<Generation> generation, OpenAiResponse response,
              v1::GenerateResponse first, httplib::Response& res);
  void HandleModels(httplib::Response& res);
  void HandleHealth(httplib::Response& res);

  // The router's model (cached after the first answer; asked again while
  // unknown). UNAVAILABLE while the router has none.
  absl::StatusOr<v1::ModelCard> Model(bool refresh);

  // Takes a slot; false when --max_concurrent_generations are running.
  bool TryAcquireSlot();
  void ReleaseSlot() { running_.fetch_sub(1); }
  void Register(GenerateCall* call, bool stream);
  void Unregister(GenerateCall* call, bool stream);
  void CancelAll();
  void Drain();

  const OpenAiServerOptions options_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::shared_ptr<prometheus::Registry> registry_;
  HttpMetrics metrics_;
  const int64_t created_;
  httplib::Server server_;
  std::atomic<int> running_{0};
  std::atomic<bool> draining_{false};

  absl::Mutex mu_;
  std::optional<v1::ModelCard> model_ ABSL_GUARDED_BY(mu_);
  std::set<GenerateCall*> calls_ ABSL_GUARDED_BY(mu_);
};

bool OpenAiFront::TryAcquireSlot() {
  if (running_.fetch_add(1) >= options_.max_concurrent_generations) {
    running_.fetch_sub(1);
    return false;
  }
  return true;
}

void OpenAiFront::Register(GenerateCall* call, bool stream) {
  metrics_.OnGenerationStarted(stream);
  absl::MutexLock lock(&mu_);
  calls_.insert(call);
}

void OpenAiFront::Unregister(GenerateCall* call, bool stream) {
  metrics_.OnGenerationFinished(stream);
  absl::MutexLock lock(&mu_);
  calls_.erase(call);
}

void OpenAiFront::CancelAll() {
  absl::MutexLock lock(&mu_);
  for (GenerateCall* call : calls_) call->Cancel();
}

absl::StatusOr<v1::ModelCard> OpenAiFront::Model(bool refresh) {
  if (!refresh) {
    absl::MutexLock lock(&mu_);
    if (model_) return *model_;
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  v1::ListModelsResponse models;
  const grpc::Status status = stub_->ListModels(&context, {}, &models);
  if (!status.ok()) {
    // The detail (the router's address, the socket error) is the
    // operator's, in the log; a client learns only that it is down.
    std::cerr << "dedit-openai: router unreachable: " << status.error_message()
              << "\n";
    return absl::UnavailableError("the model server is unavailable");
  }
  if (models.models_size() == 0) {
    return absl::UnavailableError("the router serves no model yet");
  }
  absl::MutexLock lock(&mu_);
  model_ = models.models(0);
  return *model_;
}

void OpenAiFront::HandleGenerate(Endpoint endpoint, const httplib::Request& req,
                                 httplib::Response& res) {
  if (draining_) {
    return ReplyError(res,
                      ServerError(503, "the server is shutting down",
                                  "service_unavailable_error", "draining"));
  }
  if (!TryAcquireSlot()) {
    return ReplyError(
        res, ServerError(429,
                         absl::StrCat("too many concurrent requests (at most ",
                                      options_.max_concurrent_generations,
                                      "); retry later"),
                         "rate_limit_error", "too_many_concurrent_requests"));
  }
  // Released by the Generation's end below or, for a stream, by the
  // content provider's releaser.
  bool slot_handed_over = false;
  struct SlotGuard {
    OpenAiFront* front;
    bool* handed_over;
    ~SlotGuard() {
      if (!*handed_over) front->ReleaseSlot();
    }
  } guard{this, &slot_handed_over};

  absl::StatusOr<v1::ModelCard> card = Model(/*refresh=*/false);
  if (!card.ok()) {
    return ReplyError(res,
                      ServerError(503, std::string(card.status().message()),
                                  "service_unavailable_error", "unavailable"));
  }
  ServedModel served;
  served.name = card->name();
  served.max_tokens_limit = card->max_tokens_limit();
  served.default_chat_max_tokens = options_.default_chat_max_tokens;
  OpenAiRequest request;
  std::optional<ApiError> error =
      ParseOpenAiRequest(endpoint, req.body, served, &request);
  if (error && error->code == "model_not_found") {
    // The router may have been restarted with another model.
    card = Model(/*refresh=*/true);
    if (card.ok() && card->name() != served.name) {
      served.name = card->name();
      request = OpenAiRequest();
      error = ParseOpenAiRequest(endpoint, req.body, served, &request);
    }
  }
  if (error) return ReplyError(res, *error);

  auto generation =
      std::make_unique<Generation>(this, request.stream, request.generate);
  OpenAiResponse response(endpoint, request.model, request.include_usage);
  // Nothing is sent before the router's first answer: a request it refuses
  // gets the right HTTP status, not a 200 stream carrying an error.
  v1::GenerateResponse message;
  if (generation->call().Next(absl::InfiniteDuration(), &message) ==
      GenerateCall::Event::kFinished) {
    const grpc::Status status = generation->call().status();
    return ReplyError(res, status.ok()
                               ? ServerError(500, "the router sent no response",
                                             "server_error", "internal")
                               : ApiErrorFromGrpc(status, endpoint));
  }
  if (request.stream) {
    slot_handed_over = true;
    return Stream(std::move(generation), std::move(response),
                  std::move(message), res);
  }
  // One body at the end: the client's connection is checked while waiting,
  // and a client that went away cancels the router call (freeing the
  // sequence), as a failed write does for a stream.
  const ConnectionProbe connection(req);
  response.Append(message);
  while (true) {
    const GenerateCall::Event event = generation->call().Next(
        absl::Milliseconds(kDisconnectCheckMs), &message);
    if (event == GenerateCall::Event::kFinished) break;
    if (event == GenerateCall::Event::kMessage) response.Append(message);
    if (connection.ClientGone()) {
      generation->call().Cancel();
      metrics_.OnClientDisconnect();
      res.status = 499;  // nginx's "client closed request", for the logs
      return;  // nobody to answer; the Generation waits for the call's end
    }
  }
  const grpc::Status status = generation->call().status();
  if (!status.ok()) return ReplyError(res, ApiErrorFromGrpc(status, endpoint));
  res.set_content(response.Body(), "application/json");
}

void OpenAiFront::Stream(std::unique_ptr<Generation> generation,
                         OpenAiResponse response, v1::GenerateResponse first,
                         httplib::Response& res) {
  // Owned by the provider: cpp-httplib calls it on this connection's thread
  // until sink.done(), a failed write, or the server stopping, then runs the
  // releaser.
  struct StreamState {
    std::unique_ptr<Generation> generation;
    OpenAiResponse response;
    std::optional<v1::GenerateResponse> pending;
    bool complete = false;
  };
  auto state = std::make_shared<StreamState>(StreamState{
      std::move(generation), std::move(response), std::move(first), false});
  const absl::Duration heartbeat =
      absl::Milliseconds(options_.sse_heartbeat_ms);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [state, heartbeat](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& data) {
          // A failed write means the client is gone: returning false ends
          // the response, and the releaser cancels the router call. An
          // empty write would end the chunked body (cpp-httplib reads it as
          // the last chunk): a message whose text is still held back (a
          // possible stop string, an incomplete UTF-8 sequence) writes
          // nothing.
          return data.empty() || sink.write(data.data(), data.size());
        };
        if (state->pending) {
          const std::string events = state->response.StreamEvents(
              *std::exchange(state->pending, std::nullopt));
          return write(events);
        }
        GenerateCall& call = state->generation->call();
        v1::GenerateResponse message;
        switch (call.Next(heartbeat, &message)) {
          case GenerateCall::Event::kMessage:
            return write(state->response.StreamEvents(message));
          case GenerateCall::Event::kTimeout:
            return write(": keep-alive\n\n");
          case GenerateCall::Event::kFinished:
            break;
        }
        const grpc::Status status = call.status();
        state->complete = true;
        const bool ok =
            write(status.ok() ? state->response.StreamEnd()
                              : OpenAiResponse::StreamError(ApiErrorFromGrpc(
                                    status, Endpoint::kCompletions)));
        if (ok) sink.done();
        return ok;
      },
      [this, state](bool) {
        if (!state->complete) {
          state->generation->call().Cancel();
          metrics_.OnClientDisconnect();
        }
        state->generation.reset();  // waits for the cancelled call's end
        ReleaseSlot();
      });
}

void OpenAiFront::HandleModels(httplib::Response& res) {
  // While the router is down or serves nothing, 503: an empty list would
  // tell a client that no model exists.
  absl::StatusOr<v1::ModelCard> card = Model(/*refresh=*/true);
  if (!card.ok()) {
    return ReplyError(res,
                      ServerError(503, std::string(card.status().message()),
                                  "service_unavailable_error", "unavailable"));
  }
  json data = json::array();
  data.push_back({{"id", card->name()},
                  {"object", "model"},
                  {"created", created_},
                  {"owned_by", "dedit"},
                  {"root", card->name()},
                  {"max_model_len", card->max_context()}});
  res.set_content(json({{"object", "list"}, {"data", data}}).dump(),
                  "application/json");
}

void OpenAiFront::HandleHealth(httplib::Response& res) {
  if (draining_) {
    return ReplyError(
        res, ServerError(503, "shutting down", "service_unavailable_error",
                         "draining"));
  }
  absl::StatusOr<v1::ModelCard> card = Model(/*refresh=*/true);
  if (!card.ok()) {
    return ReplyError(res,
                      ServerError(503, std::string(card.status().message()),
                                  "service_unavailable_error", "unavailable"));
  }
  res.set_content(json({{"status", "ok"}, {"model", card->name()}}).dump(),
                  "application/json");
}

void OpenAiFront::Routes() {
  server_.Post("/v1/completions",
               [this](const httplib::Request& req, httplib::Response& res) {
                 HandleGenerate(Endpoint::kCompletions, req, res);
               });
  server_.Post("/v1/chat/completions",
               [this](const httplib::Request& req, httplib::Response& res) {
                 HandleGenerate(Endpoint::kChatCompletions, req, res);
               });
  server_.Get("/v1/models",
              [this](const httplib::Request&, httplib::Response& res) {
                HandleModels(res);
              });
  server_.Get("/health", [this](const httplib::Request&,
                                httplib::Response& res) { HandleHealth(res); });
  server_.Get(
      "/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(
            prometheus::TextSerializer().Serialize(registry_->Collect()),
            "text/plain; version=0.0.4");
      });
  server_.set_pre_routing_handler(
      [](const httplib::Request&, httplib::Response&) {
        request_start = Clock::now();
        return httplib::Server::HandlerResponse::Unhandled;
      });
  // cpp-httplib's own refusals (no route, oversized or malformed request)
  // get OpenAI's error JSON too; an oversized body is a 400 as OpenAI's.
  server_.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty())
          return httplib::Server::HandlerResponse::Unhandled;
        ApiError e;
        e.http_status = res.status;
        if (res.status == 413) {
          e.http_status = 400;
          e.message = absl::StrCat("the request body exceeds ",
                                   options_.max_body_bytes, " bytes");
        } else if (res.status == 404) {
          e.type = "not_found_error";
          e.message = absl::StrCat("no route for ", req.method, " ", req.path);
        } else if (res.status == 405) {
          e.message = absl::StrCat(req.method, " is not allowed on ", req.path);
        } else {
          e.message = "malformed HTTP request";
        }
        ReplyError(res, e);
        return httplib::Server::HandlerResponse::Handled;
      }));
  server_.set_exception_handler([](const httplib::Request&,
                                   httplib::Response& res,
                                   std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    }
    ReplyError(res, ServerError(500, what, "server_error", "internal"));
  });
  server_.set_logger([this](const httplib::Request& req,
                            const httplib::Response& res) {
    // cpp-httplib's own refusals (malformed request, oversized body) skip
    // the pre-routing handler: counted, without a duration.
    std::optional<double> seconds;
    if (request_start) {
      seconds =
          std::chrono::duration<double>(Clock::now() - *request_start).count();
    }
    request_start.reset();
    metrics_.OnResponse(HttpMetrics::RouteLabel(req.path), res.status, seconds);
  });
}

void OpenAiFront::Drain() {
  draining_ = true;
  auto wait_idle = [&](int timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (running_.load() > 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return running_.load() == 0;
  };
  if (!wait_idle(options_.drain_timeout_ms)) {
    CancelAll();  // streams end with an error event, then [DONE]
    wait_idle(5000);
  }
}

absl::Status OpenAiFront::Serve() {
  Routes();
  const int threads = options_.http_threads;
  server_.new_task_queue = [threads] {
    return new httplib::ThreadPool(threads);
  };
  server_.set_payload_max_length(options_.max_body_bytes);
  server_.set_keep_alive_timeout(options_.keep_alive_timeout_s);
  server_.set_read_timeout(options_.read_timeout_s, 0);
  server_.set_write_timeout(options_.write_timeout_s, 0);
  server_.set_tcp_nodelay(true);
  int port = options_.port;
  if (port == 0) {
    port = server_.bind_to_any_port(options_.host);
  } else if (!server_.bind_to_port(options_.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.host, ":", options_.port));
  }
  std::thread listener([this] { server_.listen_after_bind(); });
  // The API and /metrics share the port; there is no gRPC port.
  absl::Status ready = WriteReadyFile(options_.ready_file, 0, port);
  if (!ready.ok()) {
    server_.stop();
    listener.join();
    return ready;
  }
  std::fprintf(stderr,
               "dedit-openai: router %s, HTTP port %d (%d threads, at most %d "
               "concurrent generations)\n",
               options_.router_address.c_str(), port, options_.http_threads,
               options_.max_concurrent_generations);
  const int signal = WaitForShutdownSignal();
  std::fprintf(stderr, "dedit-openai: signal %d, draining\n", signal);
  Drain();
  server_.stop();
  listener.join();
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateOpenAiServerOptions(const OpenAiServerOptions& o) {
  if (o.max_concurrent_generations < 1) {
    return absl::InvalidArgumentError(
        "--max_concurrent_generations must be "
        ">= 1");
  }
  if (o.http_threads < o.max_concurrent_generations + 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_threads (", o.http_threads,
        ") must be at least --max_concurrent_generations + 4 (",
        o.max_concurrent_generations + 4,
        "): every stream holds a pool thread, and /health, /metrics and "
        "refusals need free ones"));
  }
  if (o.max_body_bytes < 1024) {
    return absl::InvalidArgumentError("--max_body_bytes must be >= 1024");
  }
  if (o.sse_heartbeat_ms < 10 || o.request_timeout_ms < 1 ||
      o.default_chat_max_tokens < 1) {
    return absl::InvalidArgumentError(
        "--sse_heartbeat_ms >= 10, --request_timeout_ms >= 1 and "
        "--default_chat_max_tokens >= 1 are required");
  }
  return absl::OkStatus();
}

absl::Status RunOpenAiServer(const OpenAiServerOptions& options) {
  if (absl::Status s = ValidateOpenAiServerOptions(options); !s.ok()) return s;
  OpenAiFront front(options);
  return front.Serve();
}

}  // namespace dedit
