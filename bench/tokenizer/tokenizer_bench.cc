// Encode throughput of dedit's tokenizer on the golden corpus, printed in
// the same format as hf_bench.js so that run_bench.sh can show both.
//
//   dedit_tokenizer_bench --tokenizer tokenizer.json --corpus corpus.json
//                         [--min_seconds 3]
//
// Two workloads over the same text: "cases" encodes every corpus string
// separately (many short calls, like chat turns), "document" encodes all
// of them joined by newlines as one text (a long prompt). Single thread;
// the word cache is warm (one untimed pass first), as in a running server.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/tokenizer/json_util.h"
#include "common/tokenizer/tokenizer.h"

namespace dedit {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string tokenizer_path;
  std::string corpus_path;
  double min_seconds = 3.0;
};

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Repeats `pass` (which encodes `bytes_per_pass` bytes and returns the
// number of ids) until min_seconds have elapsed; returns MB/s.
template <typename Pass>
double Measure(const Options& options, size_t bytes_per_pass, Pass pass,
               size_t* ids_per_pass) {
  *ids_per_pass = pass();  // Warm-up, untimed.
  size_t passes = 0;
  const Clock::time_point start = Clock::now();
  Clock::duration elapsed{};
  do {
    pass();
    ++passes;
    elapsed = Clock::now() - start;
  } while (Seconds(elapsed) < options.min_seconds);
  return static_cast<double>(bytes_per_pass) * passes / Seconds(elapsed) / 1e6;
}

int Run(const Options& options) {
  const Clock::time_point load_start = Clock::now();
  auto tokenizer = Tokenizer::FromFile(options.tokenizer_path);
  const double load_seconds = Seconds(Clock::now() - load_start);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  auto text = ReadFileToString(options.corpus_path);
  if (!text.ok()) {
    std::fprintf(stderr, "%s\n", text.status().ToString().c_str());
    return 1;
  }
  auto corpus = ParseJson(*text, options.corpus_path);
  if (!corpus.ok() || !corpus->contains("cases")) {
    std::fprintf(stderr, "bad corpus %s\n", options.corpus_path.c_str());
    return 1;
  }
  std::vector<std::string> cases;
  std::string document;
  size_t case_bytes = 0;
  for (const auto& c : (*corpus)["cases"]) {
    cases.push_back(c["text"].get<std::string>());
    case_bytes += cases.back().size();
    if (!document.empty()) document += "\n";
    document += cases.back();
  }
  const Tokenizer& tok = **tokenizer;
  bool failed = false;
  auto encode_cases = [&]() {
    size_t ids = 0;
    for (const std::string& s : cases) {
      auto encoded = tok.Encode(s);
      failed |= !encoded.ok();
      if (encoded.ok()) ids += encoded->size();
    }
    return ids;
  };
  auto encode_document = [&]() {
    auto encoded = tok.Encode(document);
    failed |= !encoded.ok();
    return encoded.ok() ? encoded->size() : 0;
  };
  size_t case_ids = 0, document_ids = 0;
  const double cases_mbps =
      Measure(options, case_bytes, encode_cases, &case_ids);
  const double document_mbps =
      Measure(options, document.size(), encode_document, &document_ids);
  if (failed) {
    std::fprintf(stderr, "encoding failed\n");
    return 1;
  }
  std::printf(
      "dedit (C++)             load %.2f s | cases: %zu strings, %zu bytes, "
      "%zu ids, %.2f MB/s | document: %zu bytes, %zu ids, %.2f MB/s\n",
      load_seconds, cases.size(), case_bytes, case_ids, cases_mbps,
      document.size(), document_ids, document_mbps);
  return 0;
}

}  // namespace
}  // namespace dedit

int main(int argc, char** argv) {
  dedit::Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokenizer") {
      options.tokenizer_path = argv[i + 1];
    } else if (flag == "--corpus") {
      options.corpus_path = argv[i + 1];
    } else if (flag == "--min_seconds") {
      options.min_seconds = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (options.tokenizer_path.empty() || options.corpus_path.empty()) {
    std::fprintf(stderr,
                 "usage: dedit_tokenizer_bench --tokenizer PATH --corpus PATH "
                 "[--min_seconds S]\n");
    return 2;
  }
  return dedit::Run(options);
}
