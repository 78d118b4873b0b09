// dedit-services-bench-client: N concurrent streaming Generate clients
// against dedit-router, in C++ so that the client's own cost stays out of
// the services' per-token figure (a Python gRPC client adds ~100 µs per
// streamed message). Same flags and JSON line as bench_client.py:
//
//   dedit-services-bench-client --router 127.0.0.1:50050 --prompts p.jsonl
//       --concurrency 4 --requests 4 --max_tokens 64 --window 16 --passes 3
//
// Reports decode time per output token ((last token - first token) /
// (tokens - 1), mean over requests, prefill excluded), throughput (all
// tokens / wall time), mean TTFT and mean acceptance length.
#include <grpcpp/grpcpp.h>

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
#include "dedit/v1/services.grpc.pb.h"

ABSL_FLAG(std::string, router, "127.0.0.1:50050", "dedit-router address");
ABSL_FLAG(int, concurrency, 1, "concurrent clients");
ABSL_FLAG(int, requests, 4, "requests per client, one after another");
ABSL_FLAG(int, max_tokens, 64, "new tokens per request (ignore_eos)");
ABSL_FLAG(int, window, 16, "W");
ABSL_FLAG(int, passes, 3, "K");
ABSL_FLAG(bool, no_speculation, false, "target-only");
ABSL_FLAG(std::string, method, "model", "model or ngram");
ABSL_FLAG(std::string, prompts, "", "JSON lines of prompt ids (required)");

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

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
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
