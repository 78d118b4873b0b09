// dedit-engine-bench: what one round costs on this engine, in one process
// (bench/README.md, "Engine efficiency"):
//   * ATen ops per target decode forward and per drafter pass (RecordFunction
//     callbacks), all ops and top-level ops only (what the caller
//     dispatched; nested ops run inside them), per layer;
//   * decode(1 token) ms, verify(W) ms and draft(K) ms for one sequence, and
//     the ratios verify(W)/decode and draft(K)/decode;
//   * engine tokens/s at each --concurrency, target-only and speculative
//     (the SpeculativeEngine over the in-process backends, greedy,
//     ignore_eos), and the ratio to one sequence;
//   * peak RSS (VmHWM) after the largest concurrency.
// One JSON object per line on stdout.
//
//   dedit-engine-bench --target DIR [--drafter DIR] [--threads 1]
//       [--device cpu|cuda] [--dtype float32|bfloat16]
//       [--window 16] [--passes 1] [--concurrency 1,4,16,64]
//       [--prompt_tokens 32] [--max_tokens 64] [--method model|ngram]
#include <ATen/Functions.h>
#include <ATen/record_function.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/engine/speculation_flags.h"
#include "common/model/cpu/cpu_flags.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/cpu/huge_pages.h"
#include "common/model/in_process.h"

ABSL_FLAG(std::string, target, "", "target model folder");
ABSL_FLAG(std::string, drafter, "", "drafter model folder (optional)");
ABSL_FLAG(int, threads, 1,
          "CPU compute threads: libtorch's and the weight-product pool's (0 = "
          "the machine's cores)");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(std::string, dtype, "float32", "float32, bfloat16 or float16");
ABSL_FLAG(int, window, 16, "W for verify and speculative runs");
ABSL_FLAG(int, passes, 1, "K for the speculative runs");
ABSL_FLAG(std::string, concurrency, "1,4,16,64", "concurrent sequences");
ABSL_FLAG(int, prompt_tokens, 32, "prompt length of the throughput runs");
ABSL_FLAG(int, max_tokens, 64, "new tokens per sequence");
ABSL_FLAG(int, context, 64, "cached tokens before the timed forwards");
ABSL_FLAG(int, reps, 30, "repetitions of each timed forward");
ABSL_FLAG(std::string, method, "model", "speculative method: model or ngram");
ABSL_FLAG(int, batch_decode, 16,
          "sequences in the timed batched decode forward (0 or 1: none)");
ABSL_FLAG(std::string, verify_rows, "",
          "comma-separated block sizes: time a forward of each, interleaved "
          "rep by rep (the cost curve staged verification trades on)");
ABSL_FLAG(double, dram_gb, 2.0,
          "GB of the read-only sum that measures the machine's DRAM read "
          "bandwidth on all cores (best of 5; decode is reported as a "
          "fraction of it); 0 skips it");
ABSL_FLAG(bool, print_ops, false,
          "print the top-level ATen ops of one decode forward and one drafter "
          "pass to stderr");

namespace dedit {
namespace {

using Clock = std::chrono::steady_clock;

// Counts ATen ops on this thread while `active` is set: all ops, top-level
// ops (what the caller dispatched; nested ops run inside them), and both
// inside the models' "dedit::decoder_layer" profiler scopes.
struct OpCounter {
  std::atomic<bool> active{false};
  int64_t all = 0, top = 0, layer_all = 0, layer_top = 0, layers = 0;
  int depth = 0;
  bool in_layer = false;
  bool print_names = false;  // --print_ops: top-level op names to stderr
};
OpCounter* g_counter = nullptr;
constexpr char kLayerScope[] = "dedit::decoder_layer";

// Installed only while CountOps counts: a global callback, even an idle
// one, makes every ATen op build a RecordFunction, which slowed a decode
// forward (~1,100 ops) far more than a verify and skewed their ratio.
at::CallbackHandle InstallOpCounter(OpCounter* counter) {
  g_counter = counter;
  return at::addGlobalCallback(
      at::RecordFunctionCallback(
          [](const at::RecordFunction& fn)
              -> std::unique_ptr<at::ObserverContext> {
            OpCounter& c = *g_counter;
            if (!c.active) return nullptr;
            if (fn.scope() == at::RecordScope::USER_SCOPE) {
              if (std::string(fn.name()) == kLayerScope) {
                c.in_layer = true;
                ++c.layers;
              }
              return nullptr;
            }
            ++c.all;
            if (c.in_layer) ++c.layer_all;
            if (c.depth++ == 0) {
              ++c.top;
              if (c.in_layer) ++c.layer_top;
              if (c.print_names) {
                std::cerr << (c.in_layer ? "layer " : "other ") << fn.name()
                          << "\n";
              }
            }
            return nullptr;
          },
          [](const at::RecordFunction& fn, at::ObserverContext*) {
            OpCounter& c = *g_counter;
            if (!c.active) return;
            if (fn.scope() == at::RecordScope::USER_SCOPE) {
              if (std::string(fn.name()) == kLayerScope) c.in_layer = false;
              return;
            }
            --c.depth;
          })
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
}

struct OpCounts {
  int64_t all, top, per_layer_all, per_layer_top;
};

template <typename Fn>
OpCounts CountOps(OpCounter& c, Fn fn) {
  c.all = c.top = c.layer_all = c.layer_top = c.layers = 0;
  c.depth = 0;
  c.in_layer = false;
  const at::CallbackHandle handle = InstallOpCounter(&c);
  c.active = true;
  fn();
  c.active = false;
  at::removeCallback(handle);
  const int64_t layers = std::max<int64_t>(c.layers, 1);
  return {c.all, c.top, c.layer_all / layers, c.layer_top / layers};
}

// Milliseconds one call of fn takes.
template <typename Fn>
double TimeMs(Fn fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double Median(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <typename Fn>
double MedianMs(int reps, Fn fn) {
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) ms.push_back(TimeMs(fn));
  return Median(std::move(ms));
}

std::vector<int32_t> RandomIds(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int> d(0, std::max(0, vocab - 200));
  std::vector<int32_t> ids(n);
  for (int32_t& t : ids) t = d(rng);
  return ids;
}

int64_t PeakRssKb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// Where the floor measurements put their threads' results (from the
// calling thread, after they joined), so that the compiler keeps the loads
// and multiply-adds that make them: a volatile store is never dropped.
volatile uint64_t floor_sink;

// fn(t) for t in [0, threads), each on its own thread, all at once;
// returns when all have.
template <typename Fn>
void OnThreads(int threads, Fn fn) {
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) workers.emplace_back([&fn, t] { fn(t); });
  for (std::thread& w : workers) w.join();
}

// The sum of n words, as fast as this CPU loads them: 64-byte loads into
// four independent sums where AVX-512 runs (the loads the weight kernels
// use), else four scalar sums.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) uint64_t SumWordsAvx512(const uint64_t* w,
                                                           int64_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = _mm512_add_epi64(a, _mm512_loadu_si512(w + i));
    b = _mm512_add_epi64(b, _mm512_loadu_si512(w + i + 8));
    c = _mm512_add_epi64(c, _mm512_loadu_si512(w + i + 16));
    d = _mm512_add_epi64(d, _mm512_loadu_si512(w + i + 24));
  }
  uint64_t total = static_cast<uint64_t>(_mm512_reduce_add_epi64(
      _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d))));
  for (; i < n; ++i) total += w[i];
  return total;
}
#endif

uint64_t SumWords(const uint64_t* w, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f")) return SumWordsAvx512(w, n);
#endif
  uint64_t a = 0, b = 0, c = 0, d = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a += w[i];
    b += w[i + 1];
    c += w[i + 2];
    d += w[i + 3];
  }
  for (; i < n; ++i) a += w[i];
  return a + b + c + d;
}

// One thread's share of the arithmetic peak: `iters` steps of 24
// independent bf16 dot products (VDPBF16PS, 32 multiply-adds each, what
// the bf16 panels run), from registers.
constexpr int kDotChains = 24, kMacsPerDot = 32;
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f,avx512bf16"))) uint32_t Bf16DotSteps(
    int64_t iters) {
  __m512 acc[kDotChains];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // bf16 1.0 pairs
  const __m512bh w = x;
  for (int64_t i = 0; i < iters; ++i) {
    for (__m512& a : acc) a = _mm512_dpbf16_ps(a, x, w);
    asm volatile("" : "+v"(x));  // keeps the loop from being folded
  }
  __m512 total = acc[0];
  for (int i = 1; i < kDotChains; ++i) total = _mm512_add_ps(total, acc[i]);
  // Its bits: a float-to-integer conversion of an unknown value may be
  // assumed in range, and then dropped with the loop.
  const float sum = _mm512_reduce_add_ps(total);
  uint32_t bits;
  std::memcpy(&bits, &sum, sizeof(bits));
  return bits;
}
#endif

// The machine's bf16 multiply-add rate, G/s, with `threads` threads at
// once (best of `reps`): the arithmetic floor of a forward of many rows,
// which must do rows x parameters multiply-adds. 0 where the CPU lacks
// AVX512_BF16. Measured, not taken from a data sheet: on a VM two vCPUs
// may share one core's vector units.
double Bf16PeakGmacPerS(int threads, int reps) {
#if defined(__x86_64__) && defined(__GNUC__)
  // VDPBF16PS: AVX512_BF16 itself, not the AVX2 kernels that also run
  // kBf16.
  if (CpuIsaOf(CpuProducts::kBf16) != CpuIsa::kAvx512) return 0;
  constexpr int64_t kIters = 4000000;  // ~0.1 s per thread at full rate
  double best = 0;
  const double macs =
      static_cast<double>(threads) * kIters * kDotChains * kMacsPerDot;
  std::vector<uint32_t> results(threads);
  for (int r = 0; r < reps; ++r) {
    const double ms = TimeMs([&] {
      OnThreads(threads, [&](int t) { results[t] = Bf16DotSteps(kIters); });
    });
    best = std::max(best, macs / (ms * 1e6));
    for (uint32_t v : results) floor_sink = v;
  }
  return best;
#else
  (void)threads, (void)reps;
  return 0;
#endif
}

// The machine's DRAM read bandwidth, GB/s: `threads` threads each sum
// their slice of a `bytes` buffer (far larger than any cache), best of
// `reps`. This is the floor a weight-streaming decode step is measured
// against: a one-row forward reads each weight byte once, so it can go no
// faster than its weight bytes at this rate. The buffer is written first so
// that its pages are mapped, by the threads that later read them.
double DramReadGbPerS(int64_t bytes, int threads, int reps) {
  const int64_t words = bytes / static_cast<int64_t>(sizeof(uint64_t));
  // Allocated as the weight panels are (2 MB pages where the kernel gives
  // them), so that the floor is read as the weights are.
  LargeArray<uint64_t> buffer(words);
  if (buffer.data() == nullptr) return 0;
  const int64_t per = (words + threads - 1) / threads;
  // Thread t's slice, [begin, end).
  auto slice = [&](int t) {
    const int64_t begin = std::min(words, t * per);
    return std::make_pair(begin, std::min(words, begin + per));
  };
  OnThreads(threads, [&](int t) {
    const auto [begin, end] = slice(t);
    for (int64_t i = begin; i < end; ++i) buffer[i] = static_cast<uint64_t>(i);
  });
  std::vector<uint64_t> sums(threads);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const double ms = TimeMs([&] {
      OnThreads(threads, [&](int t) {
        const auto [begin, end] = slice(t);
        sums[t] = SumWords(buffer.data() + begin, end - begin);
      });
    });
    for (uint64_t v : sums) floor_sink = v;
    best = std::max(best,
                    static_cast<double>(words * sizeof(uint64_t)) / (ms * 1e6));
  }
  return best;
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::cerr << "dedit-engine-bench: " << what << ": " << s << "\n";
    std::exit(1);
  }
}

// Prints the machine's floors in this run: its DRAM read bandwidth on all
// cores and on one (the floor of a decode step that streams its weights),
// and its bf16 multiply-add rate on the process's threads (the floor of a
// forward of many rows).
struct Floors {
  double dram_gbps = 0, peak_gmacs = 0;
};
Floors MeasureFloors() {
  Floors f;
  const double dram_gb = absl::GetFlag(FLAGS_dram_gb);
  if (dram_gb <= 0) return f;
  const int cores = ProcessComputeThreads(0);
  const auto bytes = static_cast<int64_t>(dram_gb * 1e9);
  f.dram_gbps = DramReadGbPerS(bytes, cores, 5);
  const int threads = ProcessComputeThreads(absl::GetFlag(FLAGS_threads));
  f.peak_gmacs = Bf16PeakGmacPerS(threads, 3);
  std::cout
      << nlohmann::json{{"what", "dram_read"},
                        {"bytes", bytes},
                        {"threads", cores},
                        {"gb_per_s", f.dram_gbps},
                        {"one_thread_gb_per_s",
                         cores > 1 ? DramReadGbPerS(bytes, 1, 5) : f.dram_gbps},
                        {"bf16_peak_threads", threads},
                        {"bf16_peak_gmac_per_s", f.peak_gmacs},
                        {"bf16_one_thread_gmac_per_s",
                         threads > 1 ? Bf16PeakGmacPerS(1, 3) : f.peak_gmacs}}
             .dump()
      << std::endl;
  return f;
}

// The timed forwards of one sequence with --context cached tokens (each
// rolled back after its repetition), and the engine runs, over one
// in-process stack.
class EngineBench {
 public:
  explicit EngineBench(InProcessStack* stack)
      : stack_(stack),
        target_(stack->target()),
        drafter_(stack->drafter()),
        config_(target_.config()),
        window_(absl::GetFlag(FLAGS_window)),
        ctx_(absl::GetFlag(FLAGS_context)),
        reps_(absl::GetFlag(FLAGS_reps)) {
    counter_.print_names = absl::GetFlag(FLAGS_print_ops);
  }

  // Prints the "ops" and "forward_ms" lines (and "verify_rows_ms" with
  // --verify_rows).
  int TimeForwards(const Floors& floors) {
    Check(target_.AddSequence(kSeq), "add");
    const std::vector<int32_t> prompt = Ids(ctx_);
    Check(target_.Forward({{kSeq, prompt, 0, {ctx_ - 1}}}).status(), "prefill");
    Forward(1);  // warm-up
    Forward(window_);
    const OpCounts decode_ops = CountOps(counter_, [&] { Forward(1); });
    decode_ms_ = MedianMs(reps_, [&] { Forward(1); });
    const double verify_ms = MedianMs(reps_, [&] { Forward(window_); });
    if (int status = TimeVerifyRows(); status != 0) return status;
    const int batch = absl::GetFlag(FLAGS_batch_decode);
    const double batch_decode_ms = batch > 1 ? TimeBatchDecode(batch) : 0;
    nlohmann::json ops = {
        {"what", "ops"},
        {"target_layers", config_.num_hidden_layers},
        {"target_decode_ops_all", decode_ops.all},
        {"target_decode_ops_top", decode_ops.top},
        {"target_ops_per_layer_all", decode_ops.per_layer_all},
        {"target_ops_per_layer_top", decode_ops.per_layer_top}};
    nlohmann::json timing = {{"what", "forward_ms"},
                             {"context", ctx_},
                             {"decode_ms", decode_ms_},
                             {"verify_ms", verify_ms},
                             {"window", window_},
                             {"verify_over_decode", verify_ms / decode_ms_}};
    AddWeightStreaming(floors, &timing);
    if (batch > 1) {
      timing["batch_decode"] = batch;
      timing["batch_decode_ms"] = batch_decode_ms;
      // Tokens per second of the batched forward over one sequence's.
      timing["batch_decode_scaling"] = batch * decode_ms_ / batch_decode_ms;
    }
    if (drafter_ != nullptr) TimeDrafter(&ops, &timing);
    Check(target_.RemoveSequence(kSeq), "remove");
    std::cout << ops.dump() << "\n" << timing.dump() << std::endl;
    return 0;
  }

  // Prints a "throughput" line per mode and --concurrency level.
  int TimeEngine() {
    std::vector<int> levels;
    for (absl::string_view s :
         absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
      int v = 0;
      if (absl::SimpleAtoi(s, &v) && v > 0) levels.push_back(v);
    }
    std::vector<std::string> modes = {"target_only"};
    if (drafter_ != nullptr || absl::GetFlag(FLAGS_method) == "ngram") {
      modes.push_back("speculative");
    }
    for (const std::string& mode : modes) {
      double one = 0;
      for (int n : levels) {
        if (int status = TimeEngineLevel(mode, n, levels.front(), &one);
            status != 0) {
          return status;
        }
      }
    }
    std::cout << nlohmann::json{{"what", "memory"},
                                {"peak_rss_kb", PeakRssKb()},
                                {"max_concurrency",
                                 levels.empty() ? 0 : levels.back()},
                                {"prompt_tokens",
                                 absl::GetFlag(FLAGS_prompt_tokens)}}
                     .dump()
              << std::endl;
    return 0;
  }

 private:
  static constexpr SequenceId kSeq = 1;

  std::vector<int32_t> Ids(int n) {
    return RandomIds(rng_, n, config_.vocab_size);
  }

  // A forward of n new rows after the cached context, rolled back.
  void Forward(int n) {
    TargetSegment s{kSeq, Ids(n), ctx_, {}};
    for (int i = 0; i < n; ++i) s.logit_rows.push_back(i);
    Check(target_.Forward({s}).status(), "forward");
    Check(target_.Truncate(kSeq, ctx_), "truncate");
  }

  // Forwards of several block sizes, each rep running every size once, so
  // that a slow spell of the machine touches every size alike.
  int TimeVerifyRows() {
    if (absl::GetFlag(FLAGS_verify_rows).empty()) return 0;
    std::vector<int> sizes;
    for (absl::string_view part : absl::StrSplit(
             absl::GetFlag(FLAGS_verify_rows), ',', absl::SkipEmpty())) {
      int n = 0;
      if (!absl::SimpleAtoi(part, &n) || n < 1 ||
          ctx_ + n > config_.max_position_embeddings) {
        std::cerr << "dedit-engine-bench: bad --verify_rows entry " << part
                  << "\n";
        return 1;
      }
      sizes.push_back(n);
    }
    std::vector<std::vector<double>> ms(sizes.size());
    for (int r = 0; r < reps_; ++r) {
      for (size_t i = 0; i < sizes.size(); ++i) {
        ms[i].push_back(TimeMs([&] { Forward(sizes[i]); }));
      }
    }
    nlohmann::json rows = {{"what", "verify_rows_ms"}, {"context", ctx_}};
    for (size_t i = 0; i < sizes.size(); ++i) {
      rows[std::to_string(sizes[i])] = Median(std::move(ms[i]));
    }
    std::cout << rows.dump() << std::endl;
    return 0;
  }

  // One decode forward of `batch` sequences at --context cached tokens
  // each, one token each: the model's share of a batched target-only step,
  // without the engine around it.
  double TimeBatchDecode(int batch) {
    std::vector<TargetSegment> prefills;
    for (int b = 1; b < batch; ++b) {
      Check(target_.AddSequence(kSeq + b), "add");
      prefills.push_back({kSeq + b, Ids(ctx_), 0, {ctx_ - 1}});
    }
    Check(target_.Forward(prefills).status(), "prefill");
    auto batch_forward = [&] {
      std::vector<TargetSegment> steps;
      for (int b = 0; b < batch; ++b) {
        steps.push_back({kSeq + b, Ids(1), ctx_, {0}});
      }
      Check(target_.Forward(steps).status(), "batch forward");
      for (int b = 0; b < batch; ++b) {
        Check(target_.Truncate(kSeq + b, ctx_), "truncate");
      }
    };
    batch_forward();  // warm-up
    const double ms = MedianMs(reps_, batch_forward);
    for (int b = 1; b < batch; ++b) {
      Check(target_.RemoveSequence(kSeq + b), "remove");
    }
    return ms;
  }

  // The weight bytes one decode step streams, at what rate, and the floor
  // of a forward of n rows: its weight bytes at the DRAM rate or its
  // multiply-adds (n x weights) at the bf16 rate, whichever is longer
  // (bf16 panels: 2 bytes a weight).
  void AddWeightStreaming(const Floors& floors, nlohmann::json* timing) const {
    const int64_t bytes = target_.panel_bytes();
    if (bytes <= 0) return;
    const double gbps = static_cast<double>(bytes) / (decode_ms_ * 1e6);
    (*timing)["decode_weight_bytes"] = bytes;
    (*timing)["decode_gb_per_s"] = gbps;
    if (floors.dram_gbps > 0) {
      (*timing)["decode_over_dram"] = gbps / floors.dram_gbps;
    }
    if (floors.dram_gbps <= 0 || floors.peak_gmacs <= 0 ||
        GetCpuProducts() != CpuProducts::kBf16) {
      return;
    }
    auto floor_ms = [&](int n) {
      return std::max(
          static_cast<double>(bytes) / (floors.dram_gbps * 1e6),
          n * static_cast<double>(bytes) / 2 / (floors.peak_gmacs * 1e6));
    };
    (*timing)["floor_ms"] = {{"1", floor_ms(1)},
                             {"9", floor_ms(9)},
                             {"16", floor_ms(16)},
                             {"17", floor_ms(17)}};
  }

  // A drafter pass's ops, K = 1..3 drafts and a round's context update,
  // each against the decode step.
  void TimeDrafter(nlohmann::json* ops, nlohmann::json* timing) {
    Check(drafter_->AddSequence(kSeq), "drafter add");
    at::Tensor features = at::randn({ctx_, drafter_->feature_width()});
    Check(drafter_->AppendContext(kSeq, 0, features), "context");
    const int32_t bonus = Ids(1)[0];
    auto draft = [&](int passes) {
      DraftRequest r;
      r.sequence = kSeq;
      r.start = ctx_;
      r.window = window_;
      r.passes = passes;
      r.bonus = bonus;
      Check(drafter_->Draft({r}).status(), "draft");
    };
    draft(1);
    const OpCounts pass_ops = CountOps(counter_, [&] { draft(1); });
    (*ops)["drafter_layers"] = drafter_->config().layers.num_hidden_layers;
    (*ops)["drafter_pass_ops_all"] = pass_ops.all;
    (*ops)["drafter_pass_ops_top"] = pass_ops.top;
    (*ops)["drafter_ops_per_layer_top"] = pass_ops.per_layer_top;
    // A round's context update: the features of the ~2 tokens a round
    // commits, appended (then cut back, to keep the context length).
    const at::Tensor round_features = at::randn({2, drafter_->feature_width()});
    const double context_ms = MedianMs(reps_, [&] {
      Check(drafter_->AppendContext(kSeq, ctx_, round_features), "context");
      Check(drafter_->TruncateContext(kSeq, ctx_), "context truncate");
    });
    (*timing)["context_ms_n2"] = context_ms;
    (*timing)["context_over_decode"] = context_ms / decode_ms_;
    for (int k = 1; k <= 3; ++k) {
      const double ms = MedianMs(reps_, [&] { draft(k); });
      (*timing)["draft_ms_k" + std::to_string(k)] = ms;
      (*timing)["draft_over_decode_k" + std::to_string(k)] = ms / decode_ms_;
    }
    Check(drafter_->RemoveSequence(kSeq), "drafter remove");
  }

  GenerationRequest EngineRequest(const std::string& mode) {
    GenerationRequest r;
    r.prompt = Ids(absl::GetFlag(FLAGS_prompt_tokens));
    r.max_new_tokens = absl::GetFlag(FLAGS_max_tokens);
    r.ignore_eos = true;
    if (mode == "target_only") {
      r.window = 1;
      r.passes = 0;
      return r;
    }
    r.window = window_;
    r.passes = absl::GetFlag(FLAGS_passes);
    if (absl::GetFlag(FLAGS_method) == "ngram") {
      r.method = DraftMethod::kNgram;
      r.passes = 1;
    }
    return r;
  }

  // n concurrent requests through the engine; `one` is the first level's
  // tokens per second per sequence, set on the first level.
  int TimeEngineLevel(const std::string& mode, int n, int first_level,
                      double* one) {
    std::vector<GenerationRequest> requests;
    for (int i = 0; i < n; ++i) requests.push_back(EngineRequest(mode));
    const auto t0 = Clock::now();
    auto results = stack_->engine().Generate(requests);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    Check(results.status(), "generate");
    int64_t tokens = 0;
    std::vector<RoundRecord> rounds;
    for (const GenerationResult& r : *results) {
      if (!r.status.ok()) {
        std::cerr << "dedit-engine-bench: " << mode
                  << " request failed: " << r.status << "\n";
        return 1;
      }
      tokens += static_cast<int64_t>(r.tokens.size());
      rounds.insert(rounds.end(), r.rounds.begin(), r.rounds.end());
    }
    const double tps = tokens / s;
    const AcceptanceSummary summary = Summarize(rounds);
    if (n == first_level) *one = tps / n * first_level;
    nlohmann::json line = {{"what", "throughput"},
                           {"mode", mode},
                           {"concurrency", n},
                           {"tokens", tokens},
                           {"seconds", s},
                           {"tokens_per_s", tps},
                           {"tau", summary.mean_acceptance_length()},
                           {"paused_rounds", summary.paused_rounds},
                           {"vs_first_level", *one > 0 ? tps / *one : 0.0}};
    std::cout << line.dump() << std::endl;
    return 0;
  }

  InProcessStack* stack_;
  Qwen3Model& target_;
  DEditDrafter* drafter_;
  const Qwen3Config& config_;
  const int window_, ctx_, reps_;
  std::mt19937 rng_{7};
  OpCounter counter_;
  double decode_ms_ = 0;
};

int Main() {
  Check(ApplyCpuKernelFlags(absl::GetFlag(FLAGS_threads)), "flags");
  InProcessStack::Options o;
  auto speculation = SpeculationOptionsFromFlags();
  Check(speculation.status(), "flags");
  o.speculation = *speculation;
  o.target_dir = absl::GetFlag(FLAGS_target);
  o.drafter_dir = absl::GetFlag(FLAGS_drafter);
  o.device = absl::GetFlag(FLAGS_device);
  o.dtype = absl::GetFlag(FLAGS_dtype);
  auto stack = InProcessStack::Load(o);
  Check(stack.status(), "load");
  const Floors floors = MeasureFloors();
  EngineBench bench(stack->get());
  if (int status = bench.TimeForwards(floors); status != 0) return status;
  return bench.TimeEngine();
}

}  // namespace
}  // namespace dedit

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_target).empty()) {
    std::cerr << "usage: dedit-engine-bench --target DIR [--drafter DIR] ...\n";
    return 2;
  }
  return dedit::Main();
}
