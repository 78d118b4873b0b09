// The trainer's forward must be the engine's math: a checkpoint exported by
// the trainer, loaded by common/model/qwen3_model.h and
// common/model/dedit_drafter.h, gives the same logits, features, draft tokens
// and confidences; and the trainer reproduces the independent Python reference
// (tests/golden).
#include "training/trainable_models.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "common/base/checkpoint_layout.h"
#include "common/base/file_util.h"
#include "common/base/safetensors.h"
#include "common/engine/ngram_drafter.h"
#include "common/model/cpu/cpu_panels.h"
#include "common/model/dedit_drafter.h"
#include "common/model/qwen3_model.h"
#include "common/model/tensor_io.h"
#include "training/drafter_trainer.h"

namespace dedit::training {
namespace {

const std::string kGolden =
    std::string(DEDIT_SOURCE_DIR) + "/tests/testdata/golden";

std::string TempDir() {
  char tmpl[] = "/tmp/dedit_training_test_XXXXXX";
  const char* dir = mkdtemp(tmpl);
  EXPECT_NE(dir, nullptr);
  return dir;
}

Qwen3Config SmallTarget(bool tied) {
  Qwen3Config c;
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = tied;
  c.eos_token_ids = {94};
  return c;
}

DrafterConfig SmallDrafter(const Qwen3Config& target) {
  DrafterConfig d;
  d.layers = target;
  d.layers.num_hidden_layers = 2;
  d.block_size = 6;
  d.mask_token_id = 95;
  d.target_layer_ids = {0, 2};
  d.num_target_layers = target.num_hidden_layers;
  d.num_passes = 3;
  d.has_dedit_config = true;
  return d;
}

// Fresh weights are too tame to catch a misplaced norm: scale every tensor
// up and move norm weights away from 1.
void Roughen(ParameterList* params, uint64_t seed) {
  at::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (NamedParameter& p : *params) {
    if (p.value.dim() == 1) {
      p.value.add_(at::normal(0.0, 0.2, p.value.sizes(), gen));
    } else {
      p.value.mul_(5.0);
    }
  }
}

std::vector<int32_t> Tokens(int n, int vocab, uint64_t seed) {
  std::vector<int32_t> out;
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out.push_back(static_cast<int32_t>((x >> 33) % vocab));
  }
  return out;
}

at::Tensor AsBatch(const std::vector<std::vector<int32_t>>& rows) {
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return at::tensor(flat, at::TensorOptions().dtype(at::kLong))
      .view({static_cast<int64_t>(rows.size()), -1});
}

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

double MaxAbs(const at::Tensor& a) { return a.abs().max().item<double>(); }

class TargetEquivalenceTest : public ::testing::TestWithParam<bool> {};

TEST_P(TargetEquivalenceTest, ExportedTargetMatchesEngineForward) {
  at::NoGradGuard no_grad;
  const Qwen3Config config = SmallTarget(GetParam());
  auto model = TrainableTarget::Init(config, 7);
  ASSERT_TRUE(model.ok()) << model.status();
  Roughen(&model->parameters(), 8);
  const std::string dir = TempDir();
  ASSERT_TRUE(model->Export(dir, at::kFloat, {}).ok());

  Qwen3Model::Options opts;
  opts.feature_layer_ids = {0, 2};
  auto engine = Qwen3Model::Load(dir, opts);
  ASSERT_TRUE(engine.ok()) << engine.status();

  const std::vector<std::vector<int32_t>> seqs = {Tokens(13, 96, 1),
                                                  Tokens(13, 96, 2)};
  at::Tensor features;
  at::Tensor logits =
      model->Logits(model->Forward(AsBatch(seqs), {0, 2}, &features));
  for (size_t s = 0; s < seqs.size(); ++s) {
    ASSERT_TRUE((*engine)->AddSequence(s).ok());
    TargetSegment seg;
    seg.sequence = s;
    seg.tokens = seqs[s];
    seg.start = 0;
    for (int r = 0; r < 13; ++r) seg.logit_rows.push_back(r);
    auto out = (*engine)->Forward({seg});
    ASSERT_TRUE(out.ok()) << out.status();
    const double scale = 1.0 + MaxAbs(out->logits);
    EXPECT_LT(MaxAbsDiff(out->logits, logits[s]), 1e-4 * scale);
    EXPECT_LT(MaxAbsDiff(out->features, features[s]),
              1e-4 * (1.0 + MaxAbs(out->features)));
  }
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, TargetEquivalenceTest,
                         ::testing::Bool());

struct EnginePair {
  std::unique_ptr<Qwen3Model> target;
  std::unique_ptr<DEditDrafter> drafter;
};

// (causal editor, lookup-seeded P1)
class DrafterEquivalenceTest
    : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

// P1..P3 of the engine's Draft (tokens + confidences) equal the trainer's
// BlockLogits on the same inputs, for several anchors in one batch on both
// sides (one engine call drafts every anchor's sequence, packed). Seeded,
// the engine's requests carry the engine's lookup seed and the trainer's
// P1 input is SeedWithLookup's: the two must agree too.
TEST_P(DrafterEquivalenceTest, ExportedDrafterMatchesEngineDraft) {
  at::NoGradGuard no_grad;
  const bool causal = std::get<0>(GetParam()), seeded = std::get<1>(GetParam());
  // Seeded, the output head is the target's own (untied): with tied
  // embeddings a random drafter copies its input token, so every block
  // would keep its seed and the trust rule's other side go untested.
  const Qwen3Config tc = SmallTarget(/*tied=*/!seeded);
  DrafterConfig dc = SmallDrafter(tc);
  dc.causal_editor = causal;
  dc.lookup_seed_ngram = seeded ? 2 : 0;
  // Seeded, every pass adds the trust bonus at the seed's slots.
  dc.seed_logit_bonus = seeded ? 2.5 : 0;
  auto target = TrainableTarget::Init(tc, 11);
  auto drafter = TrainableDrafter::Init(dc, 12);
  ASSERT_TRUE(target.ok() && drafter.ok());
  Roughen(&target->parameters(), 13);
  Roughen(&drafter->parameters(), 14);
  const std::string dir = TempDir();
  ASSERT_TRUE(target->Export(dir + "/target", at::kFloat, {}).ok());
  ASSERT_TRUE(drafter->Export(dir + "/drafter", at::kFloat, {}).ok());

  // Ten tokens, then the first eight again with one changed: the later
  // anchors find earlier 2-grams to copy from.
  std::vector<int32_t> seq = Tokens(10, 94, 5);
  for (int i = 0; i < 8; ++i) seq.push_back(i == 5 ? 93 : seq[i]);
  seq.push_back(7);
  seq.push_back(8);
  const std::vector<int64_t> anchors = {3, 12, 14};
  const int w = dc.block_size;

  // Trainer side: features of the whole sequence (causal, so positions < a
  // equal the engine's prefix features), one block per anchor.
  at::Tensor features;
  target->Forward(AsBatch({seq}), dc.target_layer_ids, &features);
  DrafterContext ctx = drafter->ProjectContext(features);
  at::Tensor anchor_t =
      at::tensor(anchors, at::TensorOptions().dtype(at::kLong)).view({1, -1});
  std::vector<int64_t> p1;
  for (int64_t a : anchors) {
    p1.push_back(seq[a]);
    for (int j = 1; j < w; ++j) p1.push_back(dc.mask_token_id);
  }
  at::Tensor input = at::tensor(p1, at::TensorOptions().dtype(at::kLong))
                         .view({1, static_cast<int64_t>(anchors.size()), w});
  if (seeded) {
    DistillRecord record{0, seq};
    BlockBatch batch;
    batch.anchors = anchor_t;
    batch.p1_tokens = input;
    SeedWithLookup({&record}, dc.lookup_seed_ngram, dc.mask_token_id, &batch);
    // Anchors 12 and 14 end in 2-grams seen before, anchor 3 does not.
    EXPECT_EQ(batch.p1_tokens[0][0][1].item<int64_t>(), dc.mask_token_id);
    EXPECT_EQ(batch.p1_tokens[0][1][1].item<int64_t>(), seq[3]);
    EXPECT_EQ(batch.p1_tokens[0][2][1].item<int64_t>(), seq[5]);
    input = batch.p1_tokens;
  }
  // The seed's slots and tokens, for the bonus (none unseeded).
  const at::Tensor p1_input = input;
  const at::Tensor seed = input.narrow(-1, 1, w - 1);
  const at::Tensor seeded_slot = seed.ne(dc.mask_token_id);

  // Engine side: one sequence per anchor with the prefix as context, with
  // the CPU's loops (f32 panels) and with the ATen composition that other
  // devices run (blas products).
  auto engine_drafts = [&](CpuProducts products) {
    const CpuProducts saved = GetCpuProducts();
    SetCpuProducts(products);
    Qwen3Model::Options topts;
    topts.feature_layer_ids = dc.target_layer_ids;
    auto engine_target = Qwen3Model::Load(dir + "/target", topts);
    EXPECT_TRUE(engine_target.ok()) << engine_target.status();
    auto engine_drafter = DEditDrafter::Load(
        dir + "/drafter", (*engine_target)->embed_tokens(),
        (*engine_target)->lm_head(), DEditDrafter::Options{});
    EXPECT_TRUE(engine_drafter.ok()) << engine_drafter.status();
    EXPECT_EQ((*engine_drafter)->causal_editor(), causal);
    EXPECT_EQ((*engine_drafter)->config().lookup_seed_ngram, seeded ? 2 : 0);
    EXPECT_EQ((*engine_drafter)->config().seed_logit_bonus,
              dc.seed_logit_bonus);
    std::vector<DraftRequest> requests;
    for (size_t i = 0; i < anchors.size(); ++i) {
      const int64_t a = anchors[i];
      EXPECT_TRUE((*engine_target)->AddSequence(i).ok());
      TargetSegment seg{
          i, std::vector<int32_t>(seq.begin(), seq.begin() + a), 0, {}};
      auto out = (*engine_target)->Forward({seg});
      EXPECT_TRUE(out.ok()) << out.status();
      EXPECT_TRUE((*engine_drafter)->AddSequence(i).ok());
      EXPECT_TRUE((*engine_drafter)->AppendContext(i, 0, out->features).ok());
      DraftRequest r;
      r.sequence = i;
      r.start = a;
      r.bonus = seq[a];
      r.window = w;
      r.passes = 3;
      if (seeded) {
        const std::vector<int32_t> known(seq.begin(), seq.begin() + a + 1);
        r.seed = NgramDrafter(LookupSeedOptions(dc.lookup_seed_ngram, w))
                     .Propose(known, w - 1);
      }
      requests.push_back(r);
    }
    auto d = (*engine_drafter)->Draft(requests);
    EXPECT_TRUE(d.ok()) << d.status();
    SetCpuProducts(saved);
    return d.ok() ? *d : std::vector<DraftResult>();
  };
  // The loops need a kernel other than blas (f32 panels: AVX2+FMA or AVX-512);
  // without one both runs take the ATen composition.
  const std::vector<DraftResult> drafts = engine_drafts(
      CpuRuns(CpuProducts::kF32) ? CpuProducts::kF32 : CpuProducts::kBlas);
  const std::vector<DraftResult> blas_drafts =
      engine_drafts(CpuProducts::kBlas);
  ASSERT_EQ(drafts.size(), anchors.size());
  ASSERT_EQ(blas_drafts.size(), anchors.size());
  int left_seed = 0;  // seeded slots after a block left its seed

  for (int pass = 0; pass < 3; ++pass) {
    // The causal editor masks the edit passes only.
    at::Tensor logits =
        drafter->BlockLogits(ctx, input, anchor_t, causal && pass > 0,
                             target->embed_tokens(), target->lm_head());
    const at::Tensor raw = logits.clone();
    // Trust in the seed: the bonus at each seeded slot while every seeded
    // slot before it in the block chose the seed's token with it.
    for (size_t i = 0; i < anchors.size(); ++i) {
      bool following = true;
      for (int k = 0; k < w - 1 && seeded_slot[0][i][k].item<bool>(); ++k) {
        if (!following) {
          ++left_seed;
          continue;
        }
        const int64_t token = seed[0][i][k].item<int64_t>();
        at::Tensor row = logits[0][i][k];
        row[token] += dc.seed_logit_bonus;
        following = row.argmax().item<int64_t>() == token;
      }
    }
    // The trainer's vectorized rule (AddSeedTrust) gives the same logits.
    EXPECT_LT(MaxAbsDiff(AddSeedTrust(raw, p1_input, dc.mask_token_id,
                                      dc.seed_logit_bonus),
                         logits),
              1e-6)
        << "pass " << pass + 1;
    auto [max_logit, argmax] = logits.max(-1);
    at::Tensor conf =
        at::exp(logits - max_logit.unsqueeze(-1)).sum(-1).reciprocal();
    for (size_t i = 0; i < anchors.size(); ++i) {
      for (const std::vector<DraftResult>* engine : {&drafts, &blas_drafts}) {
        const DraftPass& e = (*engine)[i].passes[pass];
        for (int k = 0; k < w - 1; ++k) {
          EXPECT_EQ(argmax[0][i][k].item<int64_t>(), e.tokens[k])
              << "pass " << pass + 1 << " anchor " << anchors[i] << " slot "
              << k + 1 << (engine == &drafts ? "" : " (blas)");
          EXPECT_NEAR(conf[0][i][k].item<float>(), e.confidences[k], 1e-5);
        }
      }
    }
    // Next pass input: [anchor, the engine's proposal].
    std::vector<int64_t> next;
    for (size_t i = 0; i < anchors.size(); ++i) {
      next.push_back(seq[anchors[i]]);
      for (int32_t t : drafts[i].passes[pass].tokens) next.push_back(t);
    }
    input = at::tensor(next, at::TensorOptions().dtype(at::kLong))
                .view(input.sizes());
  }
  // Seeded, some block leaves its seed with seeded slots to go, so the
  // rule's both sides are compared.
  if (seeded) {
    EXPECT_GT(left_seed, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(BidirectionalAndCausalMaskedAndSeeded,
                         DrafterEquivalenceTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Bool()));

at::Tensor Expected(const std::string& name) {
  auto file = SafetensorsFile::Open(kGolden + "/expected.safetensors");
  EXPECT_TRUE(file.ok());
  const TensorView* v = (*file)->Find(name);
  EXPECT_NE(v, nullptr) << name;
  return *ToTensor(*v, at::kFloat, c10::Device(c10::kCPU));
}

// The independent Python reference (tests/golden/make_golden.py): the
// trainer's forward reproduces its target logits/features and drafter
// P1/P2 logits and the causal-editor variant.
TEST(GoldenReferenceTest, TrainerReproducesPythonReference) {
  at::NoGradGuard no_grad;
  auto target = TrainableTarget::Load(kGolden + "/target");
  ASSERT_TRUE(target.ok()) << target.status();
  auto drafter = TrainableDrafter::Load(kGolden + "/drafter");
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  at::Tensor ids = Expected("input_ids").to(at::kLong).view({1, -1});
  at::Tensor features;
  at::Tensor logits = target->Logits(
      target->Forward(ids, drafter->config().target_layer_ids, &features));
  EXPECT_LT(MaxAbsDiff(logits[0], Expected("target_logits")), 1e-4);
  EXPECT_LT(MaxAbsDiff(features[0], Expected("target_features")), 1e-4);

  const int64_t n = ids.size(1);
  DrafterContext ctx = drafter->ProjectContext(features);
  at::Tensor anchor = at::full({1, 1}, n, at::TensorOptions().dtype(at::kLong));
  // The block sits at positions n..n+W-1; context = all n prompt features.
  auto check = [&](const char* tokens_name, const char* logits_name,
                   bool causal) {
    at::Tensor block = Expected(tokens_name).to(at::kLong).view({1, 1, -1});
    at::Tensor got = drafter->BlockLogits(
        ctx, block, anchor, causal, target->embed_tokens(), target->lm_head());
    at::Tensor want = Expected(logits_name).narrow(0, 1, block.size(2) - 1);
    EXPECT_LT(MaxAbsDiff(got[0][0], want), 1e-4) << logits_name;
  };
  check("block_p1_tokens", "drafter_p1_logits", false);
  check("block_p2_tokens", "drafter_p2_logits", false);
  check("block_p1_tokens", "drafter_p1_causal_logits", true);
}

TEST(TrainableTargetTest, GradientsReachEveryParameter) {
  auto model = TrainableTarget::Init(SmallTarget(true), 3);
  ASSERT_TRUE(model.ok());
  at::Tensor ids = AsBatch({Tokens(9, 96, 3), Tokens(9, 96, 4)});
  at::Tensor loss =
      model->Logits(model->Forward(ids, {}, nullptr)).pow(2).mean();
  loss.backward();
  for (const NamedParameter& p : model->parameters()) {
    ASSERT_TRUE(p.value.grad().defined()) << p.name;
    EXPECT_GT(p.value.grad().abs().sum().item<double>(), 0) << p.name;
  }
}

TEST(TrainableTargetTest, FreezeStopsGradients) {
  auto model = TrainableTarget::Init(SmallTarget(true), 3);
  ASSERT_TRUE(model.ok());
  model->Freeze();
  for (const NamedParameter& p : model->parameters()) {
    EXPECT_FALSE(p.value.requires_grad()) << p.name;
  }
}

// The trainer's parameters are the checkpoint layout
// (common/base/checkpoint_layout.h) name for name, shape for shape, in order:
// the same table the engine's loader checks.
void ExpectFollowsLayout(const ParameterList& params,
                         const std::vector<CheckpointTensor>& layout) {
  ASSERT_EQ(params.size(), layout.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].name, layout[i].name);
    EXPECT_EQ(params[i].value.sizes().vec(), layout[i].shape) << params[i].name;
  }
}

TEST(TrainerLayoutTest, ParametersFollowTheCheckpointLayout) {
  for (bool tied : {true, false}) {
    const Qwen3Config config = SmallTarget(tied);
    auto target = TrainableTarget::Init(config, 1);
    ASSERT_TRUE(target.ok()) << target.status();
    ExpectFollowsLayout(target->parameters(), TargetCheckpointLayout(config));
    const DrafterConfig drafter_config = SmallDrafter(config);
    auto drafter = TrainableDrafter::Init(drafter_config, 2);
    ASSERT_TRUE(drafter.ok()) << drafter.status();
    ExpectFollowsLayout(drafter->parameters(),
                        DrafterCheckpointLayout(drafter_config));
  }
}

TEST(TrainerLayoutTest, ExportWritesOnlyTheCheckpointFiles) {
  auto model = TrainableTarget::Init(SmallTarget(false), 1);
  ASSERT_TRUE(model.ok());
  const std::string dir = TempDir() + "/out/target";
  ASSERT_TRUE(
      model->Export(dir, at::kBFloat16, {{"tokenizer.json", "{}"}}).ok());
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model.safetensors",
                                             "tokenizer.json"}));
  auto reloaded = TrainableTarget::Load(dir);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  ExpectFollowsLayout(reloaded->parameters(),
                      TargetCheckpointLayout(SmallTarget(false)));
}

TEST(TrainerLayoutTest, ExportRefusesParametersOutsideTheLayout) {
  auto drafter = TrainableDrafter::Init(SmallDrafter(SmallTarget(true)), 2);
  ASSERT_TRUE(drafter.ok());
  // fc was built for two feature layers; a config naming one no longer
  // describes these weights, and the engine would refuse the export.
  drafter->mutable_config().target_layer_ids = {1};
  const std::string dir = TempDir() + "/drafter";
  const absl::Status status = drafter->Export(dir, at::kFloat, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("fc.weight"));
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("[64, 128]"));
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(TrainerLayoutTest, LoadNamesTensorAndBothShapes) {
  auto model = TrainableTarget::Init(SmallTarget(true), 1);
  ASSERT_TRUE(model.ok());
  const std::string dir = TempDir();
  ASSERT_TRUE(model->Export(dir, at::kFloat, {}).ok());
  // Re-export the same weights under a config with a wider MLP.
  Qwen3Config wider = SmallTarget(true);
  wider.intermediate_size = 128;
  ASSERT_TRUE(
      WriteFileAtomically(dir + "/config.json", Qwen3ConfigToJson(wider)).ok());
  auto loaded = TrainableTarget::Load(dir);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(loaded.status().message(),
            "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [96, 64], "
            "expected [128, 64]");
}

}  // namespace
}  // namespace dedit::training
