#include "tests/model/test_util.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "common/base/safetensors.h"
#include "common/engine/speculative_engine.h"
#include "common/model/cpu/cpu_product_pool.h"
#include "common/model/cpu/cpu_threads.h"
#include "common/model/local_backends.h"
#include "common/model/tensor_io.h"
#include "gtest/gtest.h"

namespace dedit::testing {
namespace {

// Removes every directory made by MakeTempDir when the binary exits.
struct TempDirs {
  std::vector<std::string> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};
TempDirs& AllTempDirs() {
  static TempDirs* dirs = new TempDirs;
  return *dirs;
}

struct ThreadInit {
  ThreadInit() { SetCpuThreads(1); }
} thread_init;

}  // namespace

std::string MakeTempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp ? tmp : "/tmp") + "/dedit_test_XXXXXX";
  char* made = mkdtemp(tmpl.data());
  EXPECT_NE(made, nullptr);
  AllTempDirs().dirs.push_back(tmpl);
  return tmpl;
}

c10::Device TestDevice() {
  const char* dev = std::getenv("DEDIT_TEST_DEVICE");
  return c10::Device(dev ? dev : "cpu");
}

std::unique_ptr<TinyPair> MakeTinyPair(const TinyModelSpec& spec,
                                       uint64_t seed) {
  auto pair = std::make_unique<TinyPair>();
  pair->dir = MakeTempDir();
  pair->spec = spec;
  EXPECT_TRUE(WriteRandomQwen3(pair->dir + "/target", spec.target, seed).ok());
  EXPECT_TRUE(
      WriteRandomDrafter(pair->dir + "/drafter", spec.drafter, seed + 1).ok());
  Qwen3Model::Options topts;
  topts.device = TestDevice();
  topts.feature_layer_ids = spec.drafter.target_layer_ids;
  auto target = Qwen3Model::Load(pair->dir + "/target", topts);
  EXPECT_TRUE(target.ok()) << target.status();
  pair->target = std::move(*target);
  DEditDrafter::Options dopts;
  dopts.device = TestDevice();
  auto drafter =
      DEditDrafter::Load(pair->dir + "/drafter", pair->target->embed_tokens(),
                         pair->target->lm_head(), dopts);
  EXPECT_TRUE(drafter.ok()) << drafter.status();
  pair->drafter = std::move(*drafter);
  return pair;
}

std::vector<int32_t> GreedyReference(Qwen3Model& target,
                                     const std::vector<int32_t>& prompt,
                                     int max_new_tokens) {
  static SequenceId next = 1u << 30;
  const SequenceId id = next++;
  EXPECT_TRUE(target.AddSequence(id).ok());
  std::vector<int32_t> out;
  std::vector<int32_t> tokens = prompt;
  int64_t start = 0;
  while (static_cast<int>(out.size()) < max_new_tokens) {
    auto r = target.Forward(
        {{id, tokens, start, {static_cast<int>(tokens.size()) - 1}}});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) break;
    start += static_cast<int64_t>(tokens.size());
    const int32_t next_token = r->logits.argmax(-1).item<int64_t>();
    out.push_back(next_token);
    tokens = {next_token};
  }
  EXPECT_TRUE(target.RemoveSequence(id).ok());
  return out;
}

std::string GoldenDir() {
  return std::string(DEDIT_SOURCE_DIR) + "/tests/testdata/golden";
}

at::Tensor GoldenTensor(const std::string& name) {
  auto file = SafetensorsFile::Open(GoldenDir() + "/expected.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return at::Tensor();
  const TensorView* v = (*file)->Find(name);
  EXPECT_NE(v, nullptr) << name;
  if (v == nullptr) return at::Tensor();
  auto t = ToTensor(*v, v->dtype == DType::kI64 ? at::kLong : at::kFloat,
                    c10::Device(c10::kCPU));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : at::Tensor();
}

std::vector<int32_t> RandomPrompt(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(n);
  for (int& t : p) t = static_cast<int32_t>(rng() % vocab);
  return p;
}

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.contiguous().data_ptr<float>(),
                                               b.contiguous().data_ptr<float>(),
                                               a.numel() * sizeof(float)) == 0;
}

std::vector<CpuIsa> CpuIsasRunning(CpuProducts kind) {
  std::vector<CpuIsa> isas;
  for (CpuIsa cap : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    ScopedCpuIsaCap scoped(cap);
    if (CpuIsaOf(kind) == cap) isas.push_back(cap);
  }
  return isas;
}

void ExpectVerifyRowsEqualDecodeSteps(Qwen3Model& target) {
  const int64_t kPrompt = 150;
  const std::vector<int32_t> prompt = RandomPrompt(kPrompt, 128, 17);
  const std::vector<int32_t> block = RandomPrompt(17, 128, 18);
  auto segment = [](SequenceId id, int64_t start, std::vector<int32_t> tokens) {
    TargetSegment s;
    s.sequence = id;
    s.start = start;
    s.tokens = std::move(tokens);
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      s.logit_rows.push_back(static_cast<int>(i));
    }
    return s;
  };
  auto forward = [&](std::vector<TargetSegment> segments) {
    auto r = target.Forward(segments);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->logits : at::Tensor();
  };
  for (SequenceId id : {1, 2, 3}) ASSERT_TRUE(target.AddSequence(id).ok());
  forward({segment(1, 0, prompt)});
  forward({segment(2, 0, prompt)});
  // The verify block shares its forward with another sequence's prefill
  // (other rows, other key counts padded together), and the decode steps
  // run alone.
  const at::Tensor both = forward(
      {segment(3, 0, RandomPrompt(40, 128, 19)), segment(1, kPrompt, block)});
  ASSERT_TRUE(both.defined());
  const at::Tensor verify = both.narrow(0, 40, 17);
  for (size_t i = 0; i < block.size(); ++i) {
    const at::Tensor step =
        forward({segment(2, kPrompt + static_cast<int64_t>(i), {block[i]})});
    ASSERT_TRUE(step.defined());
    EXPECT_TRUE(BitEqual(step, verify.narrow(0, static_cast<int64_t>(i), 1)))
        << "row " << i << ": max diff "
        << (step - verify.narrow(0, static_cast<int64_t>(i), 1))
               .abs()
               .max()
               .item<float>();
  }
}

void ExpectLosslessSpeculation(TinyPair& pair,
                               const std::vector<int32_t>& prompt,
                               const std::vector<int32_t>& greedy) {
  SpeculativeEngine::Options o;
  o.vocab_size = pair.spec.target.vocab_size;
  o.max_context = pair.spec.target.max_position_embeddings;
  for (int threads : {1, 2}) {
    SetCpuProductThreads(threads);
    absl::Cleanup one = [] { SetCpuProductThreads(1); };
    LocalDrafter drafter(pair.drafter.get());
    LocalVerifier verifier(pair.target.get(), &drafter);
    SpeculativeEngine engine(&verifier, &drafter, o);
    for (int w : {4, 16}) {
      std::vector<GenerationRequest> reqs(2);
      for (size_t i = 0; i < reqs.size(); ++i) {
        reqs[i].prompt = prompt;
        reqs[i].max_new_tokens = static_cast<int>(greedy.size());
        reqs[i].window = w;
        reqs[i].passes = 1 + static_cast<int>(i) * 2;
      }
      auto results = engine.Generate(reqs);
      ASSERT_TRUE(results.ok()) << results.status();
      for (const GenerationResult& r : *results) {
        ASSERT_TRUE(r.status.ok()) << r.status;
        EXPECT_EQ(r.tokens, greedy) << "W=" << w << " threads " << threads;
      }
    }
  }
}

}  // namespace dedit::testing
