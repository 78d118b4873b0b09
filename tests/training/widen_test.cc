// `dedit-train widen` (training/widen.h): the shipped tiny pair widened
// exactly computes the same function. The widened target's logits equal the
// tiny one's up to float summation order, greedy chat answers agree (bf16
// products may flip a near-tie: the test logs where and by how much), the
// widened drafter proposes the same drafts over the widened target's
// features, and bad input is refused with a clear error.
#include "training/widen.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/checkpoint_layout.h"
#include "common/base/file_util.h"
#include "common/base/model_config.h"
#include "common/base/safetensors.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/dedit_drafter.h"
#include "common/model/qwen3_model.h"
#include "common/model/tensor_io.h"
#include "common/tokenizer/tokenizer.h"
#include "training/greedy_agreement.h"

namespace dedit::training {
namespace {

using ::testing::HasSubstr;

const std::string kTiny = std::string(DEDIT_SOURCE_DIR) + "/checkpoints/tiny";

// Chat prompts in the suite's formats (training/chat_tasks.py) with values
// written for this test, so not among the target's training instances.
const std::vector<std::string> kUserMessages = {
    "Add 48213 and 9377.",
    "Multiply 6071 by 38.",
    "Sort: 412, 7, 988, 130, 56, 301",
    "Reverse: lamp river stone cloud",
    "To JSON: width=12; name=box; depth=7",
    "Add 705 and 66042.",
    "Multiply 219 by 94.",
    "Sort: 15, 940, 233, 8, 671",
    "Reverse: green table quiet orbit window",
    "To JSON: id=301; tag=red",
};

std::string RenderChat(const std::string& user) {
  return absl::StrCat("<|im_start|>user\n", user,
                      "<|im_end|>\n<|im_start|>assistant\n");
}

// The kernels to compare under: the binaries' default on this CPU (bf16
// panels where AVX2+FMA or AVX512_BF16 runs) and the fp32 ones.
std::vector<CpuProducts> Kernels() {
  std::vector<CpuProducts> kinds = {CpuProducts::kBlas};
  if (CpuRuns(CpuProducts::kF32)) kinds.push_back(CpuProducts::kF32);
  if (CpuRuns(CpuProducts::kBf16)) kinds.push_back(CpuProducts::kBf16);
  return kinds;
}

class WidenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per test: ctest runs the tests as parallel processes.
    root_ = ::testing::TempDir() + "/widen_test_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    ASSERT_TRUE(MakeDirs(root_).ok());
    auto tok = Tokenizer::FromFile(kTiny + "/target/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    for (const std::string& user : kUserMessages) {
      auto ids = (*tok)->Encode(RenderChat(user));
      ASSERT_TRUE(ids.ok()) << ids.status();
      prompts_.push_back(*ids);
    }
  }
  void TearDown() override {
    SetCpuProducts(CpuProducts::kBlas);
    std::filesystem::remove_all(root_);
  }

  // checkpoints/tiny/<model> widened by `factor` into root_.
  std::string Widen(const std::string& model, int factor) {
    const std::string out = absl::StrCat(root_, "/x", factor, "/", model);
    auto summary = WidenCheckpoint({kTiny + "/" + model, out, factor});
    EXPECT_TRUE(summary.ok()) << summary.status();
    return out;
  }

  static std::unique_ptr<Qwen3Model> LoadTarget(
      const std::string& dir, std::vector<int> feature_layer_ids = {}) {
    Qwen3Model::Options o;
    o.feature_layer_ids = std::move(feature_layer_ids);
    auto model = Qwen3Model::Load(dir, o);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }

  // Logits of every row of `prompt`.
  static at::Tensor PromptLogits(Qwen3Model& model,
                                 const std::vector<int32_t>& prompt) {
    EXPECT_TRUE(model.AddSequence(1).ok());
    std::vector<int> rows(prompt.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int>(i);
    auto out = model.Forward({{1, prompt, 0, rows}});
    EXPECT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(model.RemoveSequence(1).ok());
    return out.ok() ? out->logits : at::Tensor();
  }

  std::string root_;
  std::vector<std::vector<int32_t>> prompts_;
};

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// The written tensors are the algebra of widen.h, bit for bit: at F = 4
// (a power of two) every scaled bf16 weight is the source's divided
// exactly.
TEST_F(WidenTest, WidenedTensorsAreExactCopies) {
  constexpr int kF = 4;
  const std::string target = Widen("target", kF);
  const std::string drafter = Widen("drafter", kF);
  auto load = [](const std::string& dir, const std::string& name) {
    auto archive = WeightArchive::OpenDirectory(dir);
    EXPECT_TRUE(archive.ok()) << archive.status();
    auto view = (*archive)->Get(name);
    EXPECT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->dtype, DType::kBF16) << name;  // kept on disk
    auto t = ToTensor(*view, at::kFloat, c10::Device(c10::kCPU));
    EXPECT_TRUE(t.ok()) << t.status();
    return *t;
  };
  const std::string tiny_target = kTiny + "/target";
  const DecoderLayerTensorNames l3 = TargetLayerTensorNames(3);
  // A product reading the residual: block (i, j) = W / F.
  for (const std::string& name : {l3.q_proj, l3.k_proj, l3.down_proj}) {
    const at::Tensor w = load(tiny_target, name);
    const at::Tensor wide = load(target, name);
    ASSERT_EQ(wide.size(0), kF * w.size(0)) << name;
    ASSERT_EQ(wide.size(1), kF * w.size(1)) << name;
    for (int i = 0; i < kF; ++i) {
      for (int j = 0; j < kF; ++j) {
        EXPECT_TRUE(at::equal(wide.narrow(0, i * w.size(0), w.size(0))
                                  .narrow(1, j * w.size(1), w.size(1)),
                              w / kF))
            << name << " block " << i << "," << j;
      }
    }
  }
  EXPECT_TRUE(at::equal(load(target, l3.q_norm), load(tiny_target, l3.q_norm)));
  EXPECT_TRUE(at::equal(load(target, l3.input_layernorm),
                        load(tiny_target, l3.input_layernorm).repeat({kF})));
  EXPECT_TRUE(
      at::equal(load(target, kTargetNormWeight),
                load(tiny_target, kTargetNormWeight).repeat({kF}) / kF));
  EXPECT_TRUE(at::equal(load(target, kEmbedTokensWeight),
                        load(tiny_target, kEmbedTokensWeight).repeat({1, kF})));
  // fc: feature k's columns (its F copies) get W_k / F; rows repeat.
  const at::Tensor fc = load(kTiny + "/drafter", kDrafterFcWeight);
  const at::Tensor wide_fc = load(drafter, kDrafterFcWeight);
  const int64_t h = fc.size(0);
  ASSERT_EQ(wide_fc.size(0), kF * h);
  ASSERT_EQ(wide_fc.size(1), kF * fc.size(1));
  for (int64_t k = 0; k < fc.size(1) / h; ++k) {
    for (int i = 0; i < kF; ++i) {
      for (int j = 0; j < kF; ++j) {
        EXPECT_TRUE(at::equal(
            wide_fc.narrow(0, i * h, h).narrow(1, (k * kF + j) * h, h),
            fc.narrow(1, k * h, h) / kF))
            << "fc feature " << k << " block " << i << "," << j;
      }
    }
  }
  EXPECT_TRUE(at::equal(
      load(drafter, kDrafterNormWeight),
      load(kTiny + "/drafter", kDrafterNormWeight).repeat({kF}) / kF));
  // The config: widths x F, everything else carried.
  auto config = LoadDrafterConfig(drafter);
  ASSERT_TRUE(config.ok()) << config.status();
  auto tiny_config = LoadDrafterConfig(kTiny + "/drafter");
  ASSERT_TRUE(tiny_config.ok());
  EXPECT_EQ(config->layers.hidden_size, kF * tiny_config->layers.hidden_size);
  EXPECT_EQ(config->layers.intermediate_size,
            kF * tiny_config->layers.intermediate_size);
  EXPECT_EQ(config->layers.num_attention_heads,
            kF * tiny_config->layers.num_attention_heads);
  EXPECT_EQ(config->layers.num_key_value_heads,
            kF * tiny_config->layers.num_key_value_heads);
  EXPECT_EQ(config->layers.head_dim, tiny_config->layers.head_dim);
  EXPECT_EQ(config->layers.dtype, "bfloat16");
  EXPECT_EQ(config->target_layer_ids, tiny_config->target_layer_ids);
  EXPECT_EQ(config->block_size, tiny_config->block_size);
  EXPECT_EQ(config->num_passes, tiny_config->num_passes);
  EXPECT_TRUE(PathExists(drafter + "/tokenizer.json"));
}

// Logits over a whole prompt: equal to float rounding under fp32 products;
// under bf16 products (activations rounded to bf16 before each product) a
// rounding that flips at a bf16 boundary carries through the layers, about
// as far as the bf16 products move the tiny model itself from fp32 (logged
// beside it).
TEST_F(WidenTest, TargetLogitsEqualTiny) {
  // Both sit well above the differences measured at |logit| <= 20: here (F=2),
  // and under bf16 over the 245 held-out chat prompts at F=8.
  constexpr double kFp32Tolerance = 1e-3;
  constexpr double kBf16Tolerance = 0.5;
  const std::string wide = Widen("target", 2);
  SetCpuProducts(CpuProducts::kBlas);
  const at::Tensor reference =
      PromptLogits(*LoadTarget(kTiny + "/target"), prompts_[0]);
  for (CpuProducts kind : Kernels()) {
    SCOPED_TRACE(std::string(CpuProductsName(kind)));
    SetCpuProducts(kind);
    const at::Tensor tiny =
        PromptLogits(*LoadTarget(kTiny + "/target"), prompts_[0]);
    const at::Tensor widened = PromptLogits(*LoadTarget(wide), prompts_[0]);
    const double diff = MaxAbsDiff(tiny, widened);
    const double kernel_noise = MaxAbsDiff(tiny, reference);
    std::cout << "[ widen x2 ] " << CpuProductsName(kind)
              << ": max |logit diff| " << diff
              << " (tiny vs blas: " << kernel_noise << ", max |logit| "
              << reference.abs().max().item<double>() << ")\n";
    const at::Tensor flipped = tiny.argmax(-1).ne(widened.argmax(-1));
    const int64_t flips = flipped.sum().item<int64_t>();
    std::cout << "[ widen x2 ] " << CpuProductsName(kind) << ": " << flips
              << " of " << tiny.size(0) << " prompt rows with another argmax\n";
    if (kind == CpuProducts::kBf16) {
      EXPECT_LE(diff, kBf16Tolerance);
      // Only near-ties flip: the prompt's rows predict the user's message,
      // where the model is unsure.
      EXPECT_LE(flips, tiny.size(0) / 10);
    } else {
      EXPECT_LE(diff, kFp32Tolerance);
      EXPECT_EQ(flips, 0);
    }
  }
}

// Greedy chat answers: identical up to float near-ties. The report (logged)
// has each divergence's position and top-2 gaps.
TEST_F(WidenTest, GreedyChatAnswersAgree) {
  const std::string wide = Widen("target", 2);
  for (CpuProducts kind : Kernels()) {
    if (kind == CpuProducts::kF32) continue;  // blas covers fp32
    SCOPED_TRACE(std::string(CpuProductsName(kind)));
    SetCpuProducts(kind);
    auto tiny = LoadTarget(kTiny + "/target");
    auto widened = LoadTarget(wide);
    auto report = MeasureGreedyAgreement(*tiny, *widened, prompts_, 96);
    ASSERT_TRUE(report.ok()) << report.status();
    std::cout << "[ widen x2 ] " << CpuProductsName(kind)
              << " greedy: " << report->ToJson().dump() << "\n";
    EXPECT_EQ(report->prompts.size(), prompts_.size());
    EXPECT_GE(report->agreement(), 0.85);
    EXPECT_GE(report->reference_tokens(), 10 * 20);  // real answers
    // A divergence is a near-tie of the tiny model, not a new function.
    for (const PromptAgreement& p : report->prompts) {
      if (!p.identical()) EXPECT_LT(p.reference_top2_gap, 0.5);
    }
  }
}

// The widened drafter over the widened target's features proposes what the
// tiny drafter proposes over the tiny target's, pass for pass, along each
// prompt's greedy continuation (both driven by the tiny target's tokens).
TEST_F(WidenTest, DrafterProposalsEqualTiny) {
  constexpr int kF = 2, kRounds = 12, kWindow = 16, kPasses = 3;
  const std::string wide_target = Widen("target", kF);
  for (const std::string model : {"drafter", "drafter-seeded"}) {
    const std::string wide_drafter = Widen(model, kF);
    auto config = LoadDrafterConfig(kTiny + "/" + model);
    ASSERT_TRUE(config.ok()) << config.status();
    for (CpuProducts kind : Kernels()) {
      SCOPED_TRACE(model + " " + std::string(CpuProductsName(kind)));
      SetCpuProducts(kind);
      struct Pair {
        std::unique_ptr<Qwen3Model> target;
        std::unique_ptr<DEditDrafter> drafter;
      };
      auto load = [&](const std::string& target_dir,
                      const std::string& drafter_dir) {
        Pair p;
        p.target = LoadTarget(target_dir, config->target_layer_ids);
        auto d = DEditDrafter::Load(drafter_dir, p.target->embed_tokens(),
                                    p.target->lm_head(), {});
        EXPECT_TRUE(d.ok()) << d.status();
        if (d.ok()) p.drafter = std::move(*d);
        return p;
      };
      Pair tiny = load(kTiny + "/target", kTiny + "/" + model);
      Pair wide = load(wide_target, wide_drafter);
      ASSERT_TRUE(tiny.drafter && wide.drafter);
      int drafts = 0, equal_drafts = 0, slots = 0, equal_slots = 0;
      for (size_t i = 0; i < prompts_.size(); ++i) {
        const SequenceId id = i + 1;
        std::vector<int32_t> tokens = prompts_[i];
        int32_t bonus = -1;
        // Prefill, then one committed token a round.
        std::vector<int32_t> segment = tokens;
        for (int round = 0; round <= kRounds; ++round) {
          const int64_t start = static_cast<int64_t>(tokens.size()) -
                                static_cast<int64_t>(segment.size());
          std::vector<DraftResult> results;
          for (Pair* p : {&tiny, &wide}) {
            if (round == 0) {
              ASSERT_TRUE(p->target->AddSequence(id).ok());
              ASSERT_TRUE(p->drafter->AddSequence(id).ok());
            }
            auto out = p->target->Forward(
                {{id, segment, start, {static_cast<int>(segment.size()) - 1}}});
            ASSERT_TRUE(out.ok()) << out.status();
            ASSERT_TRUE(
                p->drafter->AppendContext(id, start, out->features).ok());
            if (p == &tiny) bonus = out->greedy[0];
            DraftRequest r;
            r.sequence = id;
            r.start = static_cast<int64_t>(tokens.size());
            r.bonus = bonus;
            r.window = kWindow;
            r.passes = kPasses;
            if (config->lookup_seed_ngram > 0) {
              // A seed from the prompt (any seed: the same for both).
              r.seed.assign(prompts_[i].end() - 6, prompts_[i].end());
            }
            auto draft = p->drafter->Draft({r});
            ASSERT_TRUE(draft.ok()) << draft.status();
            results.push_back((*draft)[0]);
          }
          for (int k = 0; k < kPasses; ++k) {
            const DraftPass& a = results[0].passes[k];
            const DraftPass& b = results[1].passes[k];
            ++drafts;
            equal_drafts += a.tokens == b.tokens;
            bool logged = false;  // later slots of a pass follow the first
            for (size_t s = 0; s < a.tokens.size(); ++s) {
              ++slots;
              if (a.tokens[s] == b.tokens[s]) {
                ++equal_slots;
              } else if (!logged) {
                logged = true;
                std::cout << "[ widen x2 ] " << model << " "
                          << CpuProductsName(kind) << ": prompt " << i
                          << " round " << round << " pass " << k + 1 << " slot "
                          << s + 1 << ": " << a.tokens[s] << " (conf "
                          << a.confidences[s] << ") vs " << b.tokens[s]
                          << " (conf " << b.confidences[s] << ")\n";
              }
            }
          }
          segment = {bonus};
          tokens.push_back(bonus);
        }
      }
      std::cout << "[ widen x2 ] " << model << " " << CpuProductsName(kind)
                << ": " << equal_drafts << "/" << drafts
                << " passes identical, " << equal_slots << "/" << slots
                << " slots\n";
      if (kind == CpuProducts::kBf16) {
        EXPECT_GE(equal_slots, 0.97 * slots);
      } else {
        EXPECT_EQ(equal_drafts, drafts);
      }
    }
  }
}

// A factor that is not a power of two rounds each scaled bf16 weight once:
// the model is close, not exact, and the tool says so.
TEST_F(WidenTest, NonPowerOfTwoFactorIsCloseNotExact) {
  auto summary =
      WidenCheckpoint({kTiny + "/target", root_ + "/x3/target", /*factor=*/3});
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_FALSE(summary->exact);
  EXPECT_EQ(summary->hidden_size, 3 * 128);
  auto note = ReadFileToString(root_ + "/x3/target/widening.json");
  ASSERT_TRUE(note.ok());
  EXPECT_THAT(*note, HasSubstr("\"exact\": false"));
  SetCpuProducts(CpuProducts::kBlas);
  const double diff =
      MaxAbsDiff(PromptLogits(*LoadTarget(kTiny + "/target"), prompts_[0]),
                 PromptLogits(*LoadTarget(root_ + "/x3/target"), prompts_[0]));
  std::cout << "[ widen x3 ] blas: max |logit diff| " << diff << "\n";
  EXPECT_LE(diff, 0.25);  // several times the measured difference
}

// Factor 8, the wide pair of scripts/make_wide_pair.sh (293 MB target): its
// logits and greedy answers under the default products.
TEST_F(WidenTest, Factor8TargetDecodesLikeTiny) {
  const std::string wide = Widen("target", 8);
  if (CpuRuns(CpuProducts::kBf16)) SetCpuProducts(CpuProducts::kBf16);
  auto tiny = LoadTarget(kTiny + "/target");
  auto widened = LoadTarget(wide);
  ASSERT_EQ(widened->config().hidden_size, 1024);
  std::vector<std::vector<int32_t>> prompts(prompts_.begin(),
                                            prompts_.begin() + 3);
  auto report = MeasureGreedyAgreement(*tiny, *widened, prompts, 64);
  ASSERT_TRUE(report.ok()) << report.status();
  std::cout << "[ widen x8 ] " << CpuProductsName(GetCpuProducts())
            << " greedy: " << report->ToJson().dump() << "\n";
  EXPECT_LE(report->max_prompt_logit_diff, 0.5);
  EXPECT_GE(report->agreement(), 0.85);
}

TEST_F(WidenTest, RefusesBadInput) {
  const std::string target = kTiny + "/target";
  // Factor out of range.
  for (int factor : {0, -2, kMaxWidenFactor + 1}) {
    auto s = WidenCheckpoint({target, root_ + "/out", factor});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << factor;
    EXPECT_THAT(s.status().message(), HasSubstr("outside [1, 64]"));
  }
  // A missing folder.
  auto missing = WidenCheckpoint({root_ + "/nowhere", root_ + "/out", 2});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nowhere"));
  // Widening into the source folder.
  auto in_place = WidenCheckpoint({target, target + "/.", 2});
  EXPECT_EQ(in_place.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(in_place.status().message(), HasSubstr("source folder"));
  // Another architecture.
  const std::string llama = root_ + "/llama";
  ASSERT_TRUE(MakeDirs(llama).ok());
  ASSERT_TRUE(
      WriteFileAtomically(
          llama + "/config.json",
          R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8})")
          .ok());
  auto other = WidenCheckpoint({llama, root_ + "/out", 2});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.status().message(), HasSubstr("LlamaForCausalLM"));
  // A folder without config.json.
  const std::string empty = root_ + "/empty";
  ASSERT_TRUE(MakeDirs(empty).ok());
  auto no_config = WidenCheckpoint({empty, root_ + "/out", 2});
  EXPECT_EQ(no_config.status().code(), absl::StatusCode::kNotFound);
  // A drafter whose weights lack a tensor: its config with the target's
  // weights (no fc.weight), refused before anything is written.
  const std::string broken = root_ + "/broken";
  ASSERT_TRUE(MakeDirs(broken).ok());
  std::filesystem::copy(kTiny + "/drafter/config.json", broken);
  std::filesystem::copy(target + "/model.safetensors", broken);
  auto no_tensor = WidenCheckpoint({broken, root_ + "/out", 2});
  EXPECT_EQ(no_tensor.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_tensor.status().message(), HasSubstr(kDrafterFcWeight));
  EXPECT_FALSE(PathExists(root_ + "/out"));
}

}  // namespace
}  // namespace dedit::training
