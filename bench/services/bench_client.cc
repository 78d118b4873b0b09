// dedit-services-bench-client: N concurrent streaming Generate clients
// against dedit-router, in C++ so that the client's own cost stays out of the
// services' per-token figure (a Python gRPC client's cost per streamed message
// would count as services overhead; docs/log/2026-12-06-bench-notebook.md,
// "Round streams in the services"). Same flags and JSON line as
// bench_client.py:
//
//   dedit-services-bench-client --router 127.0.0.1:50050 --prompts p.jsonl
//       --concurrency 4 --requests 4 --max_tokens 64 --window 16 --passes 3
//
// Reports decode time per output token ((last token - first token) /
// (tokens - 1), mean over requests, prefill excluded), throughput (all
// tokens / wall time), mean TTFT and mean acceptance length.
//
//   dedit-services-bench-client --ping 127.0.0.1:50051 [--pings 2000]
//
// instead times bare unary calls to a dedit-target, one at a time: the
// floor under a services round (docs/log/2026-12-06-bench-notebook.md, "no
// context for sequences no model drafts"). Median and p90 round trip
// in µs of Health.Check (answered on a gRPC thread), an empty Target.Step
// (the reactor path, answered at once), an empty Target.KeepAlive (also
// a hand-off to the target's model thread and back), and a one-token
// decode Step of a 32-token sequence (a target-only round without the
// router; compare with the target's forward histogram), taking turns token
// by token with the same decoding on a Target.Rounds stream.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/serving/round_stream.h"
#include "dedit/v1/services.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

ABSL_FLAG(std::string, router, "127.0.0.1:50050", "dedit-router address");
ABSL_FLAG(int, concurrency, 1, "concurrent clients");
ABSL_FLAG(int, requests, 4, "requests per client, one after another");
ABSL_FLAG(int, max_tokens, 64, "new tokens per request (ignore_eos)");
ABSL_FLAG(int, window, 16, "W");
ABSL_FLAG(int, passes, 3, "K");
ABSL_FLAG(bool, no_speculation, false, "target-only");
ABSL_FLAG(std::string, method, "model", "model or ngram");
ABSL_FLAG(std::string, prompts, "", "JSON lines of prompt ids (required)");
ABSL_FLAG(std::string, ping, "",
          "a dedit-target address: time bare unary calls instead");
ABSL_FLAG(int, pings, 2000, "calls per kind with --ping");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

double Mean(const std::vector<double>& xs) {
  double sum = 0;
  for (double x : xs) sum += x;
  return xs.empty() ? 0.0 : sum / static_cast<double>(xs.size());
}

// Median and p90 in µs of `n` sequential calls of `call` (after 50
// untimed ones), or the first error.
template <typename Call>
nlohmann::json TimeCalls(int n, Call call) {
  std::vector<double> us;
  for (int i = 0; i < n + 50; ++i) {
    const auto t0 = Clock::now();
    const grpc::Status status = call();
    if (!status.ok()) return {{"error", status.error_message()}};
    if (i >= 50) us.push_back(1e6 * Seconds(Clock::now() - t0));
  }
  std::sort(us.begin(), us.end());
  return {{"median_us", us[us.size() / 2]}, {"p90_us", us[us.size() * 9 / 10]}};
}

int Ping(const std::string& address, int n) {
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  auto target = dedit::v1::Target::NewStub(channel);
  nlohmann::json out = {{"config", "ping_target"}, {"calls", n}};
  out["health_check"] = TimeCalls(n, [&] {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    return health->Check(&context, request, &response);
  });
  out["empty_step"] = TimeCalls(n, [&] {
    grpc::ClientContext context;
    dedit::v1::StepRequest request;
    dedit::v1::StepResponse response;
    return target->Step(&context, request, &response);
  });
  out["empty_keep_alive"] = TimeCalls(n, [&] {
    grpc::ClientContext context;
    dedit::v1::KeepAliveRequest request;
    dedit::v1::KeepAliveResponse response;
    return target->KeepAlive(&context, request, &response);
  });
  // Target-only decoding straight against the target, one token a call:
  // what a router round costs without the router (a fresh sequence id;
  // released at the end).
  const uint64_t sequence = 0x7e57000000000000ull + std::random_device()();
  // Within a 1024-token context: 32 prompt + 2 x (50 untimed + these).
  const int decode_calls = std::min(n, 400);  // per transport
  {
    grpc::ClientContext context;
    dedit::v1::StepRequest request;
    dedit::v1::StepResponse response;
    dedit::v1::PrefillItem* item = request.mutable_prefill()->add_items();
    item->set_sequence(sequence);
    for (int i = 0; i < 32; ++i) item->add_prompt(1 + i);
    item->set_reserve_tokens(32 + 2 * (decode_calls + 50) + 10);
    item->set_no_context(true);
    const grpc::Status status = target->Step(&context, request, &response);
    if (!status.ok() || response.prefill().results_size() != 1 ||
        response.prefill().results(0).code() != 0) {
      out["decode_step"] = {{"error", "prefill failed"}};
      std::printf("%s\n", out.dump().c_str());
      return 1;
    }
    int32_t bonus = response.prefill().results(0).first_token();
    int64_t start = 32;
    // The same decoding, each token sent as a unary Step or as a message
    // on one Target.Rounds stream (the router's default), the two taking
    // turns token by token so that a slow spell of the machine falls on
    // both.
    dedit::RoundStreamClient<dedit::v1::StepRequest, dedit::v1::StepResponse>
        rounds([&target](grpc::ClientContext* c, grpc::CompletionQueue* cq) {
          return target->PrepareAsyncRounds(c, cq);
        });
    std::vector<double> unary_us, stream_us;
    grpc::Status failed;
    for (int i = 0; i < 2 * (decode_calls + 50) && failed.ok(); ++i) {
      dedit::v1::StepRequest step;
      dedit::v1::StepResponse answer;
      dedit::v1::VerifyItem* v = step.mutable_verify()->add_items();
      v->set_sequence(sequence);
      v->set_start(start);
      v->add_block(bonus);
      const bool streamed = i % 2 == 1;
      const auto t0 = Clock::now();
      if (streamed) {
        const absl::Status s = rounds.Call(
            step, &answer,
            std::chrono::system_clock::now() + std::chrono::seconds(10));
        if (!s.ok()) {
          failed = grpc::Status(grpc::StatusCode::INTERNAL,
                                std::string(s.message()));
        }
      } else {
        grpc::ClientContext call;
        failed = target->Step(&call, step, &answer);
      }
      const double us = 1e6 * Seconds(Clock::now() - t0);
      if (failed.ok() && answer.verify().results_size() == 1) {
        bonus = answer.verify().results(0).target_tokens(0);
        ++start;
      }
      if (i >= 100) (streamed ? stream_us : unary_us).push_back(us);
    }
    auto summary = [](std::vector<double> us) -> nlohmann::json {
      std::sort(us.begin(), us.end());
      return {{"median_us", us[us.size() / 2]},
              {"p90_us", us[us.size() * 9 / 10]}};
    };
    if (!failed.ok()) {
      out["decode_step"] = {{"error", failed.error_message()}};
    } else {
      out["decode_step"] = summary(unary_us);
      out["decode_round_stream"] = summary(stream_us);
    }
    grpc::ClientContext release_context;
    dedit::v1::ReleaseRequest release;
    dedit::v1::ReleaseResponse released;
    release.add_sequences(sequence);
    (void)target->Release(&release_context, release, &released);
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_ping).empty()) {
    return Ping(absl::GetFlag(FLAGS_ping), absl::GetFlag(FLAGS_pings));
  }
  std::vector<std::vector<int32_t>> given;
  std::ifstream in(absl::GetFlag(FLAGS_prompts));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) {
      given.push_back(nlohmann::json::parse(line).get<std::vector<int32_t>>());
    }
  }
  if (given.empty()) {
    std::fprintf(stderr, "bench client: --prompts has no prompts\n");
    return 2;
  }
  const int concurrency = absl::GetFlag(FLAGS_concurrency);
  const int requests = absl::GetFlag(FLAGS_requests);
  const bool ngram = absl::GetFlag(FLAGS_method) == "ngram";
  auto stub = dedit::v1::Generation::NewStub(grpc::CreateChannel(
      absl::GetFlag(FLAGS_router), grpc::InsecureChannelCredentials()));

  std::mutex mu;
  std::vector<double> per_token, ttfts, taus;
  std::vector<std::string> errors;
  int64_t tokens_total = 0;
  auto client = [&](int c) {
    for (int r = 0; r < requests; ++r) {
      dedit::v1::GenerateRequest req;
      req.set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
      req.set_ignore_eos(true);
      req.set_window(absl::GetFlag(FLAGS_window));
      req.set_passes(ngram ? 0 : absl::GetFlag(FLAGS_passes));
      req.set_disable_speculation(absl::GetFlag(FLAGS_no_speculation));
      req.set_speculative_method(ngram ? dedit::v1::SPECULATIVE_METHOD_NGRAM
                                       : dedit::v1::SPECULATIVE_METHOD_MODEL);
      const auto& prompt = given[(c * requests + r) % given.size()];
      req.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::minutes(10));
      const auto t0 = Clock::now();
      Clock::time_point first{}, last{};
      int64_t n = 0;
      double tau = 0;
      auto reader = stub->Generate(&context, req);
      dedit::v1::GenerateResponse resp;
      while (reader->Read(&resp)) {
        const auto now = Clock::now();
        if (resp.token_ids_size() > 0) {
          if (n == 0) first = now;
          last = now;
          n += resp.token_ids_size();
        }
        if (resp.finished()) tau = resp.acceptance().mean_acceptance_length();
      }
      const grpc::Status status = reader->Finish();
      std::lock_guard<std::mutex> lock(mu);
      if (!status.ok()) {
        errors.push_back(status.error_message());
        continue;
      }
      tokens_total += n;
      ttfts.push_back(Seconds(first - t0));
      if (n > 1) per_token.push_back(Seconds(last - first) / (n - 1));
      taus.push_back(tau);
    }
  };
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) threads.emplace_back(client, c);
  for (std::thread& t : threads) t.join();
  const double wall = Seconds(Clock::now() - start);
  nlohmann::json out = {
      {"client", "c++"},
      {"concurrency", concurrency},
      {"requests", per_token.size()},
      {"errors", errors},
      {"speculative", !absl::GetFlag(FLAGS_no_speculation)},
      {"method", ngram ? "ngram" : "model"},
      {"window", absl::GetFlag(FLAGS_window)},
      {"passes", absl::GetFlag(FLAGS_passes)},
      {"decode_ms_per_token", 1000 * Mean(per_token)},
      {"throughput_tokens_per_s", static_cast<double>(tokens_total) / wall},
      {"mean_ttft_ms", 1000 * Mean(ttfts)},
      {"mean_acceptance_length", Mean(taus)}};
  std::printf("%s\n", out.dump().c_str());
  return errors.empty() ? 0 : 1;
}
