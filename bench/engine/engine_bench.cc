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
#include "model/cpu_flags.h"
#include "model/cpu_panels.h"
#include "model/huge_pages.h"
#include "model/in_process.h"

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
ABSL_FLAG(int, max_speculative_batch, 0,
          "speculative runs: rounds of more sequences than this decode one "
          "token each (SpeculativeEngine::Options; 0 = no limit)");
ABSL_FLAG(bool, adaptive_speculation, false,
          "speculative runs: SpeculativeEngine::Options::adaptive_speculation");
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
  if (!CpuRuns(CpuProducts::kBf16)) return 0;
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

int Main() {
  Check(ApplyCpuKernelFlags(absl::GetFlag(FLAGS_threads)), "flags");
  InProcessStack::Options o;
  o.max_speculative_batch = absl::GetFlag(FLAGS_max_speculative_batch);
  o.adaptive_speculation = absl::GetFlag(FLAGS_adaptive_speculation);
  o.target_dir = absl::GetFlag(FLAGS_target);
  o.drafter_dir = absl::GetFlag(FLAGS_drafter);
  o.device = absl::GetFlag(FLAGS_device);
  o.dtype = absl::GetFlag(FLAGS_dtype);
  auto stack = InProcessStack::Load(o);
  Check(stack.status(), "load");
  Qwen3Model& target = (*stack)->target();
  // The machine's DRAM read bandwidth, measured in this run on all cores
  // and on one: the floor of a decode step that streams its weights.
  // And its bf16 arithmetic rate on the process's threads: the floor of a
  // forward of many rows.
  const double dram_gb = absl::GetFlag(FLAGS_dram_gb);
  double dram_gbps = 0, peak_gmacs = 0;
  if (dram_gb > 0) {
    const int cores = ProcessComputeThreads(0);
    const auto bytes = static_cast<int64_t>(dram_gb * 1e9);
    dram_gbps = DramReadGbPerS(bytes, cores, 5);
    const int threads = ProcessComputeThreads(absl::GetFlag(FLAGS_threads));
    peak_gmacs = Bf16PeakGmacPerS(threads, 3);
    std::cout
        << nlohmann::json{{"what", "dram_read"},
                          {"bytes", bytes},
                          {"threads", cores},
                          {"gb_per_s", dram_gbps},
                          {"one_thread_gb_per_s",
                           cores > 1 ? DramReadGbPerS(bytes, 1, 5) : dram_gbps},
                          {"bf16_peak_threads", threads},
                          {"bf16_peak_gmac_per_s", peak_gmacs},
                          {"bf16_one_thread_gmac_per_s",
                           threads > 1 ? Bf16PeakGmacPerS(1, 3) : peak_gmacs}}
               .dump()
        << std::endl;
  }
  DEditDrafter* drafter = (*stack)->drafter();
  const Qwen3Config& c = target.config();
  const int W = absl::GetFlag(FLAGS_window);
  const int ctx = absl::GetFlag(FLAGS_context);
  const int reps = absl::GetFlag(FLAGS_reps);
  std::mt19937 rng(7);
  OpCounter counter;
  counter.print_names = absl::GetFlag(FLAGS_print_ops);

  // One sequence with `ctx` cached tokens; decode(1) and verify(W) forwards
  // roll back after each repetition.
  const SequenceId seq = 1;
  Check(target.AddSequence(seq), "add");
  const std::vector<int32_t> prompt = RandomIds(rng, ctx, c.vocab_size);
  Check(target.Forward({{seq, prompt, 0, {ctx - 1}}}).status(), "prefill");
  auto forward = [&](int n) {
    TargetSegment s{seq, RandomIds(rng, n, c.vocab_size), ctx, {}};
    for (int i = 0; i < n; ++i) s.logit_rows.push_back(i);
    Check(target.Forward({s}).status(), "forward");
    Check(target.Truncate(seq, ctx), "truncate");
  };
  forward(1);  // warm-up
  forward(W);
  const OpCounts decode_ops = CountOps(counter, [&] { forward(1); });
  const double decode_ms = MedianMs(reps, [&] { forward(1); });
  const double verify_ms = MedianMs(reps, [&] { forward(W); });
  // Forwards of several block sizes, each rep running every size once, so
  // that a slow spell of the machine touches every size alike.
  if (!absl::GetFlag(FLAGS_verify_rows).empty()) {
    std::vector<int> sizes;
    for (absl::string_view part : absl::StrSplit(
             absl::GetFlag(FLAGS_verify_rows), ',', absl::SkipEmpty())) {
      int n = 0;
      if (!absl::SimpleAtoi(part, &n) || n < 1 ||
          ctx + n > c.max_position_embeddings) {
        std::cerr << "dedit-engine-bench: bad --verify_rows entry " << part
                  << "\n";
        return 1;
      }
      sizes.push_back(n);
    }
    std::vector<std::vector<double>> ms(sizes.size());
    for (int r = 0; r < reps; ++r) {
      for (size_t i = 0; i < sizes.size(); ++i) {
        ms[i].push_back(TimeMs([&] { forward(sizes[i]); }));
      }
    }
    nlohmann::json rows = {{"what", "verify_rows_ms"}, {"context", ctx}};
    for (size_t i = 0; i < sizes.size(); ++i) {
      rows[std::to_string(sizes[i])] = Median(std::move(ms[i]));
    }
    std::cout << rows.dump() << std::endl;
  }
  // One decode forward of `batch` sequences at `ctx` cached tokens each,
  // one token each: the model's share of a batched target-only step,
  // without the engine around it.
  const int batch = absl::GetFlag(FLAGS_batch_decode);
  double batch_decode_ms = 0;
  if (batch > 1) {
    std::vector<TargetSegment> prefills;
    for (int b = 1; b < batch; ++b) {
      Check(target.AddSequence(seq + b), "add");
      prefills.push_back(
          {seq + b, RandomIds(rng, ctx, c.vocab_size), 0, {ctx - 1}});
    }
    Check(target.Forward(prefills).status(), "prefill");
    auto batch_forward = [&] {
      std::vector<TargetSegment> steps;
      for (int b = 0; b < batch; ++b) {
        steps.push_back({seq + b, RandomIds(rng, 1, c.vocab_size), ctx, {0}});
      }
      Check(target.Forward(steps).status(), "batch forward");
      for (int b = 0; b < batch; ++b) {
        Check(target.Truncate(seq + b, ctx), "truncate");
      }
    };
    batch_forward();  // warm-up
    batch_decode_ms = MedianMs(reps, batch_forward);
    for (int b = 1; b < batch; ++b) {
      Check(target.RemoveSequence(seq + b), "remove");
    }
  }
  nlohmann::json ops = {{"what", "ops"},
                        {"target_layers", c.num_hidden_layers},
                        {"target_decode_ops_all", decode_ops.all},
                        {"target_decode_ops_top", decode_ops.top},
                        {"target_ops_per_layer_all", decode_ops.per_layer_all},
                        {"target_ops_per_layer_top", decode_ops.per_layer_top}};
  nlohmann::json timing = {{"what", "forward_ms"},
                           {"context", ctx},
                           {"decode_ms", decode_ms},
                           {"verify_ms", verify_ms},
                           {"window", W},
                           {"verify_over_decode", verify_ms / decode_ms}};
  if (const int64_t bytes = target.panel_bytes(); bytes > 0) {
    // The weight bytes one decode step streams, and at what rate.
    const double gbps = static_cast<double>(bytes) / (decode_ms * 1e6);
    timing["decode_weight_bytes"] = bytes;
    timing["decode_gb_per_s"] = gbps;
    if (dram_gbps > 0) timing["decode_over_dram"] = gbps / dram_gbps;
    // The floor of a forward of n rows: its weight bytes at the DRAM rate
    // or its multiply-adds (n x weights) at the bf16 rate, whichever is
    // longer (bf16 panels: 2 bytes a weight).
    if (dram_gbps > 0 && peak_gmacs > 0 &&
        GetCpuProducts() == CpuProducts::kBf16) {
      auto floor_ms = [&](int n) {
        return std::max(
            static_cast<double>(bytes) / (dram_gbps * 1e6),
            n * static_cast<double>(bytes) / 2 / (peak_gmacs * 1e6));
      };
      timing["floor_ms"] = {{"1", floor_ms(1)},
                            {"9", floor_ms(9)},
                            {"16", floor_ms(16)},
                            {"17", floor_ms(17)}};
    }
  }
  if (batch > 1) {
    timing["batch_decode"] = batch;
    timing["batch_decode_ms"] = batch_decode_ms;
    // Tokens per second of the batched forward over one sequence's.
    timing["batch_decode_scaling"] = batch * decode_ms / batch_decode_ms;
  }
  if (drafter != nullptr) {
    Check(drafter->AddSequence(seq), "drafter add");
    at::Tensor features = at::randn({ctx, drafter->feature_width()});
    Check(drafter->AppendContext(seq, 0, features), "context");
    std::vector<int32_t> bonus = RandomIds(rng, 1, c.vocab_size);
    auto draft = [&](int passes) {
      DraftRequest r;
      r.sequence = seq;
      r.start = ctx;
      r.window = W;
      r.passes = passes;
      r.bonus = bonus[0];
      Check(drafter->Draft({r}).status(), "draft");
    };
    draft(1);
    const OpCounts pass_ops = CountOps(counter, [&] { draft(1); });
    ops["drafter_layers"] = drafter->config().layers.num_hidden_layers;
    ops["drafter_pass_ops_all"] = pass_ops.all;
    ops["drafter_pass_ops_top"] = pass_ops.top;
    ops["drafter_ops_per_layer_top"] = pass_ops.per_layer_top;
    // A round's context update: the features of the ~2 tokens a round
    // commits, appended (then cut back, to keep the context length).
    const at::Tensor round_features = at::randn({2, drafter->feature_width()});
    const double context_ms = MedianMs(reps, [&] {
      Check(drafter->AppendContext(seq, ctx, round_features), "context");
      Check(drafter->TruncateContext(seq, ctx), "context truncate");
    });
    timing["context_ms_n2"] = context_ms;
    timing["context_over_decode"] = context_ms / decode_ms;
    for (int k = 1; k <= 3; ++k) {
      const double ms = MedianMs(reps, [&] { draft(k); });
      timing["draft_ms_k" + std::to_string(k)] = ms;
      timing["draft_over_decode_k" + std::to_string(k)] = ms / decode_ms;
    }
    Check(drafter->RemoveSequence(seq), "drafter remove");
  }
  Check(target.RemoveSequence(seq), "remove");
  std::cout << ops.dump() << "\n" << timing.dump() << std::endl;

  // Throughput through the engine.
  std::vector<int> levels;
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
    int v = 0;
    if (absl::SimpleAtoi(s, &v) && v > 0) levels.push_back(v);
  }
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  std::vector<std::string> modes = {"target_only"};
  if (drafter != nullptr || absl::GetFlag(FLAGS_method) == "ngram") {
    modes.push_back("speculative");
  }
  for (const std::string& mode : modes) {
    double one = 0;
    for (int n : levels) {
      std::vector<GenerationRequest> requests;
      for (int i = 0; i < n; ++i) {
        GenerationRequest r;
        r.prompt = RandomIds(rng, prompt_tokens, c.vocab_size);
        r.max_new_tokens = max_tokens;
        r.ignore_eos = true;
        if (mode == "target_only") {
          r.window = 1;
          r.passes = 0;
        } else {
          r.window = W;
          r.passes = absl::GetFlag(FLAGS_passes);
          if (absl::GetFlag(FLAGS_method) == "ngram") {
            r.method = DraftMethod::kNgram;
            r.passes = 1;
          }
        }
        requests.push_back(std::move(r));
      }
      const auto t0 = Clock::now();
      auto results = (*stack)->engine().Generate(requests);
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
      if (n == levels.front()) one = tps / n * levels.front();
      nlohmann::json line = {{"what", "throughput"},
                             {"mode", mode},
                             {"concurrency", n},
                             {"tokens", tokens},
                             {"seconds", s},
                             {"tokens_per_s", tps},
                             {"tau", summary.mean_acceptance_length()},
                             {"paused_rounds", summary.paused_rounds},
                             {"vs_first_level", one > 0 ? tps / one : 0.0}};
      std::cout << line.dump() << std::endl;
    }
  }
  std::cout << nlohmann::json{{"what", "memory"},
                              {"peak_rss_kb", PeakRssKb()},
                              {"max_concurrency",
                               levels.empty() ? 0 : levels.back()},
                              {"prompt_tokens", prompt_tokens}}
                   .dump()
            << std::endl;
  return 0;
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
