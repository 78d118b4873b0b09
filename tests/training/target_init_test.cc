// `dedit-train target --init_from` and `dedit-train drafter --init_from`:
// training a shipped model further starts from its weights (not a fresh
// initialisation), grows a shallower one deeper, and refuses a folder of
// another shape; a resumed run logs each step once.
#include <ATen/Functions.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/file_util.h"
#include "training/distill.h"
#include "training/drafter_trainer.h"
#include "training/progress.h"
#include "training/target_trainer.h"
#include "training/trainable_models.h"

namespace dedit::training {
namespace {

using ::testing::HasSubstr;

class TargetInitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per test (ctest runs them in parallel), emptied first so
    // that no earlier run's state is resumed.
    root_ = ::testing::TempDir() + "/target_init_test_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    ASSERT_TRUE(MakeDirs(root_ + "/corpus").ok());
    // Ten small Python files: both sides of a 1-in-2 split get some.
    for (int f = 0; f < 10; ++f) {
      std::string text;
      for (int i = 0; i < 40; ++i) {
        absl::StrAppend(&text, "def f", f, "_", i, "(x):\n    return x + ", i,
                        "\n\n");
      }
      ASSERT_TRUE(
          WriteFileAtomically(absl::StrCat(root_, "/corpus/m", f, ".py"), text)
              .ok());
    }
  }

  TargetTrainingOptions Options(const std::string& name, double lr,
                                int hidden = 32) {
    TargetTrainingOptions o;
    o.tokenizer_path = std::string(DEDIT_SOURCE_DIR) +
                       "/checkpoints/tiny/target/tokenizer.json";
    o.corpus.roots = {root_ + "/corpus"};
    o.corpus.heldout_every = 2;
    o.work_dir = root_ + "/" + name + "-work";
    o.out_dir = root_ + "/" + name;
    o.model.hidden_size = hidden;
    o.model.intermediate_size = 64;
    o.model.num_hidden_layers = 2;
    o.model.num_attention_heads = 2;
    o.model.num_key_value_heads = 1;
    o.model.head_dim = 16;
    o.seq_len = 32;
    o.batch_size = 2;
    o.eval_every = 1;
    o.eval_windows = 2;
    ShortRun(lr, &o);
    return o;
  }

  // Two steps at peak learning rate `lr`, no timed checkpoint (the target
  // and drafter option structs name these fields alike).
  template <typename TrainingOptions>
  static void ShortRun(double lr, TrainingOptions* o) {
    o->steps = 2;
    o->checkpoint_every_s = 1e9;
    o->schedule.peak = lr;
  }

  // A 1-layer drafter with block 4 for the target in root_/target, trained
  // on its distilled answers in root_/distill.bin (both made by
  // MakeTargetAndDistill).
  DrafterTrainingOptions DrafterOptions(const std::string& name, double lr) {
    DrafterTrainingOptions o;
    o.target_dir = root_ + "/target";
    o.distill_path = root_ + "/distill.bin";
    o.work_dir = root_ + "/" + name + "-work";
    o.out_dir = root_ + "/" + name;
    o.num_layers = 1;
    o.block_size = 4;
    o.target_layer_ids = {0, 1};
    o.sequences_per_step = 2;
    o.blocks_per_sequence = 2;
    o.eval_every = 1000;
    ShortRun(lr, &o);
    return o;
  }

  // Distillation of `sequences` short records of the target in root_/target
  // into root_/`file`.
  DistillOptions DistillInto(const std::string& file, int sequences) const {
    DistillOptions d;
    d.target_dir = root_ + "/target";
    d.corpus.roots = {root_ + "/corpus"};
    d.corpus.heldout_every = 2;
    d.work_dir = root_ + "/target-work";
    d.out_path = root_ + "/" + file;
    d.num_sequences = sequences;
    d.prompt_min_tokens = 8;
    d.prompt_max_tokens = 16;
    d.continuation_tokens = 16;
    d.batch = 8;
    return d;
  }

  void MakeTargetAndDistill() {
    auto target = RunTargetTraining(Options("target", 2e-3));
    ASSERT_TRUE(target.ok()) << target.status();
    auto distilled = RunDistill(DistillInto("distill.bin", 8));
    ASSERT_TRUE(distilled.ok()) << distilled.status();
  }

  // The exported weights in `dir` (Model: TrainableTarget or
  // TrainableDrafter).
  template <typename Model = TrainableTarget>
  static ParameterList Weights(const std::string& dir) {
    auto model = Model::Load(dir);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? model->parameters() : ParameterList();
  }

  // `model`'s parameter `name` (undefined if it has none).
  template <typename Model>
  static at::Tensor Weight(const Model& model, const std::string& name) {
    for (const NamedParameter& p : model.parameters()) {
      if (p.name == name) return p.value;
    }
    return at::Tensor();
  }

  static bool Same(const ParameterList& a, const ParameterList& b) {
    if (a.size() != b.size() || a.empty()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!at::equal(a[i].value, b[i].value)) return false;
    }
    return true;
  }

  std::string root_;
};

TEST_F(TargetInitTest, StartsFromTheGivenWeights) {
  auto trained = RunTargetTraining(Options("a", 2e-3));
  ASSERT_TRUE(trained.ok()) << trained.status();
  // With lr 0 the weights cannot move: from --init_from they are the
  // trained model's; from a fresh start they are the initialisation's.
  TargetTrainingOptions from_a = Options("b", 0.0);
  from_a.init_from = root_ + "/a";
  ASSERT_TRUE(RunTargetTraining(from_a).ok());
  auto fresh = RunTargetTraining(Options("c", 0.0));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  const ParameterList a = Weights(root_ + "/a");
  EXPECT_TRUE(Same(Weights(root_ + "/b"), a));
  EXPECT_FALSE(Same(Weights(root_ + "/c"), a));
}

TEST_F(TargetInitTest, RefusesAnotherShape) {
  ASSERT_TRUE(RunTargetTraining(Options("d", 2e-3)).ok());
  TargetTrainingOptions wider = Options("e", 2e-3, /*hidden=*/48);
  wider.init_from = root_ + "/d";
  auto status = RunTargetTraining(wider);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.status().message(), HasSubstr("does not have the shape"));
}

// --reschedule_from_steps: a saved run continues on another number of
// steps only when asked, naming the run it came from; without the flag a
// different --steps is another run and is refused.
TEST_F(TargetInitTest, ResumesOnAnotherScheduleOnlyWhenAsked) {
  ASSERT_TRUE(RunTargetTraining(Options("r", 2e-3)).ok());  // saved at step 2
  TargetTrainingOptions longer = Options("r", 2e-3);
  longer.steps = 4;
  auto refused = RunTargetTraining(longer);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("different run"));

  TargetTrainingOptions shorter = Options("r", 2e-3);
  shorter.steps = 1;  // the state is already at step 2
  shorter.reschedule_from_steps = 2;
  auto too_short = RunTargetTraining(shorter);
  ASSERT_FALSE(too_short.ok());
  EXPECT_EQ(too_short.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_short.status().message(), HasSubstr("not past"));

  longer.reschedule_from_steps = 2;
  const ParameterList before = Weights(root_ + "/r");
  auto resumed = RunTargetTraining(longer);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_FALSE(Same(Weights(root_ + "/r"), before));  // trained on
  auto log = ReadFileToString(root_ + "/r-work/log.jsonl");
  ASSERT_TRUE(log.ok());
  EXPECT_THAT(*log, HasSubstr("\"step\":4"));
  EXPECT_THAT(*log, ::testing::Not(HasSubstr("\"step\":5")));
  // The state now belongs to the 4-step run: resuming it as such is fine.
  longer.reschedule_from_steps = 0;
  EXPECT_TRUE(RunTargetTraining(longer).ok());
}

// A run killed after its last checkpoint logged steps the resumed run
// trains again: resuming drops those records (and a torn last line), so
// log.jsonl has each step once, in order.
TEST_F(TargetInitTest, AResumedRunLogsEachStepOnce) {
  ASSERT_TRUE(RunTargetTraining(Options("k", 2e-3)).ok());  // saved at step 2
  const std::string log_path = root_ + "/k-work/log.jsonl";
  ASSERT_TRUE(AppendToFile(log_path,
                           "{\"step\":3,\"loss\":9.0}\n"
                           "{\"step\":4,\"loss\":9.0}\n"
                           "{\"step\":5,\"lo")
                  .ok());
  TargetTrainingOptions longer = Options("k", 2e-3);
  longer.steps = 4;
  longer.reschedule_from_steps = 2;
  auto resumed = RunTargetTraining(longer);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  auto log = ReadFileToString(log_path);
  ASSERT_TRUE(log.ok());
  std::vector<int64_t> steps;
  for (absl::string_view line : absl::StrSplit(*log, '\n', absl::SkipEmpty())) {
    const auto rec = nlohmann::json::parse(line);
    steps.push_back(rec["step"].get<int64_t>());
    EXPECT_NE(rec["loss"].get<double>(), 9.0) << line;  // not the dead run's
  }
  EXPECT_THAT(steps, ::testing::ElementsAre(1, 2, 3, 4));
}

TEST(DropLogRecordsAfterTest, KeepsStepsUpToTheCheckpointOnly) {
  const std::string path = ::testing::TempDir() + "/drop_log_records.jsonl";
  ASSERT_TRUE(WriteFileAtomically(path,
                                  "{\"step\":1}\n{\"step\":2,\"x\":1}\n"
                                  "{\"step\":3}\nnot json\n{\"step\":2")
                  .ok());
  ASSERT_TRUE(DropLogRecordsAfter(path, 2).ok());
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "{\"step\":1}\n{\"step\":2,\"x\":1}\n");
  ASSERT_TRUE(DropLogRecordsAfter(path, 0).ok());  // a run starting afresh
  EXPECT_EQ(*ReadFileToString(path), "");
  EXPECT_TRUE(DropLogRecordsAfter(path + ".absent", 3).ok());
}

// Depth up-scaling: a 2-layer target grown to 5 layers computes the same
// logits (its new layers add nothing until trained), keeps its layers'
// weights in order, and trains from there.
TEST_F(TargetInitTest, GrowsDeeperComputingTheSameFunction) {
  ASSERT_TRUE(RunTargetTraining(Options("g", 2e-3)).ok());
  auto small = TrainableTarget::Load(root_ + "/g");
  ASSERT_TRUE(small.ok()) << small.status();
  auto grown = TrainableTarget::Grow(*small, 5, /*seed=*/3);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(grown->config().num_hidden_layers, 5);
  const at::Tensor ids = at::randint(0, 200, {2, 12}, at::kLong);
  at::Tensor want, got;
  {
    at::NoGradGuard no_grad;
    want = small->Logits(small->Forward(ids, {}, nullptr));
    got = grown->Logits(grown->Forward(ids, {}, nullptr));
  }
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-4);
  // Old layers 0 and 1 sit at 0 and floor(1 * 5 / 2) = 2.
  EXPECT_TRUE(at::equal(Weight(*grown, "model.layers.2.mlp.up_proj.weight"),
                        Weight(*small, "model.layers.1.mlp.up_proj.weight")));
  EXPECT_EQ(Weight(*grown, "model.layers.3.mlp.down_proj.weight")
                .abs()
                .max()
                .item<float>(),
            0.0f);
  EXPECT_FALSE(TrainableTarget::Grow(*small, 1, 3).ok());

  // Through the trainer: --init_from a shallower target grows it; at lr 0
  // the export is the grown model itself.
  TargetTrainingOptions deeper = Options("h", 0.0);
  deeper.model.num_hidden_layers = 5;
  deeper.init_from = root_ + "/g";
  auto deeper_run = RunTargetTraining(deeper);
  ASSERT_TRUE(deeper_run.ok()) << deeper_run.status();
  auto exported = TrainableTarget::Load(root_ + "/h");
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->config().num_hidden_layers, 5);
  at::NoGradGuard no_grad;
  const at::Tensor out = exported->Logits(exported->Forward(ids, {}, nullptr));
  EXPECT_LT((out - want).abs().max().item<double>(), 1e-4);
}

TEST_F(TargetInitTest, DrafterStartsFromTheGivenWeights) {
  ASSERT_NO_FATAL_FAILURE(MakeTargetAndDistill());
  auto trained = RunDrafterTraining(DrafterOptions("da", 2e-3));
  ASSERT_TRUE(trained.ok()) << trained.status();
  // At lr 0 a drafter from --init_from exports the weights it started
  // from; a fresh one exports its initialisation.
  DrafterTrainingOptions from_a = DrafterOptions("db", 0.0);
  from_a.init_from = root_ + "/da";
  auto continued = RunDrafterTraining(from_a);
  ASSERT_TRUE(continued.ok()) << continued.status();
  auto fresh = RunDrafterTraining(DrafterOptions("dc", 0.0));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  const ParameterList a = Weights<TrainableDrafter>(root_ + "/da");
  EXPECT_TRUE(Same(Weights<TrainableDrafter>(root_ + "/db"), a));
  EXPECT_FALSE(Same(Weights<TrainableDrafter>(root_ + "/dc"), a));

  // Another shape is refused before anything is trained, naming both.
  DrafterTrainingOptions wider = DrafterOptions("dd", 2e-3);
  wider.block_size = 8;
  wider.init_from = root_ + "/da";
  auto refused = RunDrafterTraining(wider);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("is a 1-layer drafter"));
  EXPECT_THAT(refused.status().message(), HasSubstr("block 4"));
  EXPECT_THAT(refused.status().message(), HasSubstr("block 8"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/dd/model.safetensors"));
}

// --round_anchor_share: a run whose blocks sit where its drafter's rounds
// land trains and exports like any other; a share outside [0, 1] is
// refused before anything is trained.
TEST_F(TargetInitTest, DrafterTrainsOnRoundAnchors) {
  ASSERT_NO_FATAL_FAILURE(MakeTargetAndDistill());
  DrafterTrainingOptions on_policy = DrafterOptions("ra", 2e-3);
  on_policy.round_anchor_share = 0.5;
  auto trained = RunDrafterTraining(on_policy);
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto exported = TrainableDrafter::Load(root_ + "/ra");
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->config().block_size, 4);
  DrafterTrainingOptions too_much = DrafterOptions("rb", 2e-3);
  too_much.round_anchor_share = 1.5;
  auto refused = RunDrafterTraining(too_much);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("--round_anchor_share"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/rb/model.safetensors"));
}

// --edit_selected_weight and --edit_truth_share: runs with either train,
// log what the edit pass did to the guesses it kept, and export; values out
// of range, or a truth share without ProposalMix, are refused by name
// before anything is trained.
TEST_F(TargetInitTest, DrafterEditLossOptions) {
  ASSERT_NO_FATAL_FAILURE(MakeTargetAndDistill());
  DrafterTrainingOptions edit = DrafterOptions("ea", 2e-3);
  edit.edit_selected_weight = 0;
  edit.edit_truth_share = 0.5;
  auto trained = RunDrafterTraining(edit);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_TRUE(TrainableDrafter::Load(root_ + "/ea").ok());
  auto log = ReadFileToString(root_ + "/ea-work/log.jsonl");
  ASSERT_TRUE(log.ok());
  for (absl::string_view line : absl::StrSplit(*log, '\n', absl::SkipEmpty())) {
    const auto rec = nlohmann::json::parse(line);
    ASSERT_TRUE(rec.contains("p2_fixed")) << line;  // joint from step 0
    const double fixed = rec["p2_fixed"].get<double>();
    const double broke = rec["p2_broke"].get<double>();
    EXPECT_GE(fixed, 0.0);
    EXPECT_GE(broke, 0.0);
    EXPECT_LE(fixed + broke, 1.0);
    EXPECT_DOUBLE_EQ(rec["eta"].get<double>(), 0.5);  // 1 - share
  }
  struct Bad {
    double selected_weight, truth_share;
    bool mix;
    const char* flag;
  };
  for (const Bad& bad : {Bad{-1, 0, true, "--edit_selected_weight"},
                         Bad{std::nan(""), 0, true, "--edit_selected_weight"},
                         Bad{1, 1.5, true, "--edit_truth_share"},
                         Bad{1, 0.5, false, "--edit_truth_share"}}) {
    DrafterTrainingOptions o = DrafterOptions("eb", 2e-3);
    o.edit_selected_weight = bad.selected_weight;
    o.edit_truth_share = bad.truth_share;
    o.proposal_mix = bad.mix;
    auto refused = RunDrafterTraining(o);
    ASSERT_FALSE(refused.ok()) << bad.flag;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), HasSubstr(bad.flag));
    EXPECT_FALSE(std::filesystem::exists(root_ + "/eb/model.safetensors"));
  }
}

// --edit_truth_blocks: the uniform ground truth goes to whole blocks, drawn
// per block, and the other blocks keep ProposalMix by P1's confidence. With
// every slot of a truth block selected and an eta no confidence reaches,
// the selected share of a step is the share of its blocks drawn: about half
// over the run, and within a step neither all nor none of 16 blocks. Out of
// range, or without a truth share, it is refused by name.
TEST_F(TargetInitTest, DrafterEditTruthInSomeBlocks) {
  ASSERT_NO_FATAL_FAILURE(MakeTargetAndDistill());
  DrafterTrainingOptions blend = DrafterOptions("tb", 2e-3);
  blend.steps = 24;
  blend.sequences_per_step = 4;
  blend.blocks_per_sequence = 4;
  blend.eta = 1.0;  // a softmax over the vocabulary stays below 1 here
  blend.edit_truth_share = 1.0;
  blend.edit_truth_blocks = 0.5;
  auto trained = RunDrafterTraining(blend);
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto log = ReadFileToString(root_ + "/tb-work/log.jsonl");
  ASSERT_TRUE(log.ok());
  double sum = 0;
  int steps = 0, mixed_steps = 0;
  for (absl::string_view line : absl::StrSplit(*log, '\n', absl::SkipEmpty())) {
    const auto rec = nlohmann::json::parse(line);
    if (!rec.contains("gt_selection")) continue;
    const double g = rec["gt_selection"].get<double>();
    sum += g;
    ++steps;
    mixed_steps += g > 0 && g < 1;
  }
  ASSERT_EQ(steps, 24);
  EXPECT_GT(sum / steps, 0.3);
  EXPECT_LT(sum / steps, 0.7);
  EXPECT_GE(mixed_steps, 20);  // P(all or none of 16 blocks) = 2^-15
  struct Bad {
    double share, blocks;
  };
  for (const Bad& bad : {Bad{0.5, 0}, Bad{0.5, 1.5}, Bad{0, 0.5}}) {
    DrafterTrainingOptions o = DrafterOptions("tc", 2e-3);
    o.edit_truth_share = bad.share;
    o.edit_truth_blocks = bad.blocks;
    auto refused = RunDrafterTraining(o);
    ASSERT_FALSE(refused.ok()) << bad.share << " " << bad.blocks;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), HasSubstr("--edit_truth_blocks"));
    EXPECT_FALSE(std::filesystem::exists(root_ + "/tc/model.safetensors"));
  }
}

// --seed_logit_bonus: a lookup-seeded run trains with the trust in its
// seed and exports it in the drafter's config, where the engine reads it;
// a bonus without seeds, or outside [0, 64], is refused by name before
// anything is trained.
TEST_F(TargetInitTest, DrafterTrainsWithTrustInTheSeed) {
  ASSERT_NO_FATAL_FAILURE(MakeTargetAndDistill());
  DrafterTrainingOptions trusted = DrafterOptions("sa", 2e-3);
  trusted.lookup_seed_ngram = 1;
  trusted.seed_logit_bonus = 6;
  auto trained = RunDrafterTraining(trusted);
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto config = LoadDrafterConfig(root_ + "/sa");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->lookup_seed_ngram, 1);
  EXPECT_EQ(config->seed_logit_bonus, 6);
  struct Bad {
    int ngram;
    double bonus;
  };
  for (const Bad& bad :
       {Bad{0, 6}, Bad{1, -1}, Bad{1, 65}, Bad{1, std::nan("")}}) {
    DrafterTrainingOptions o = DrafterOptions("sb", 2e-3);
    o.lookup_seed_ngram = bad.ngram;
    o.seed_logit_bonus = bad.bonus;
    auto refused = RunDrafterTraining(o);
    ASSERT_FALSE(refused.ok()) << bad.bonus;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.status().message(), HasSubstr("--seed_logit_bonus"));
    EXPECT_FALSE(std::filesystem::exists(root_ + "/sb/model.safetensors"));
  }
}

// The logits of `drafter` for one fixed batch: 2 sequences of 10 context
// positions, 2 blocks each (random features, tokens and anchors, and a
// random shared embedding / head, as the target's would be).
at::Tensor FixedBlockLogits(const TrainableDrafter& drafter) {
  at::NoGradGuard no_grad;
  at::manual_seed(11);
  const DrafterConfig& c = drafter.config();
  const int64_t d = c.layers.hidden_size, vocab = 50;
  const at::Tensor features =
      at::randn({2, 10, static_cast<int64_t>(c.target_layer_ids.size()) * d});
  const at::Tensor tokens = at::randint(0, vocab, {2, 2, c.block_size},
                                        at::TensorOptions().dtype(at::kLong));
  const at::Tensor anchors =
      at::tensor({4, 9, 2, 7}, at::TensorOptions().dtype(at::kLong))
          .view({2, 2});
  const at::Tensor embed = at::randn({vocab, d}) * 0.1;
  return drafter.BlockLogits(drafter.ProjectContext(features), tokens, anchors,
                             /*causal=*/false, embed, embed);
}

// A deeper drafter from --init_from a shallower one drafts what it did (its
// new layers are identities until trained), keeps its layers in order, and
// trains from there.
// --data=a,b: the drafter trains on both distillation files' records, a's
// first (scripts/train_tiny.sh adds the target's answers to one kind of
// prompt this way); a missing or empty name is refused by name before
// anything is trained.
TEST_F(TargetInitTest, DrafterTrainsOnAListOfDistillationFiles) {
  ASSERT_NO_FATAL_FAILURE(MakeTargetAndDistill());
  DistillOptions d = DistillInto("distill-b.bin", 3);
  d.seed = 9;
  ASSERT_TRUE(RunDistill(d).ok());
  auto a = ReadDistillData(root_ + "/distill.bin");
  auto b = ReadDistillData(root_ + "/distill-b.bin");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), 8u);
  ASSERT_EQ(b->size(), 3u);
  auto both =
      ReadDistillFiles(root_ + "/distill.bin," + root_ + "/distill-b.bin");
  ASSERT_TRUE(both.ok()) << both.status();
  ASSERT_EQ(both->size(), 11u);
  for (size_t i = 0; i < both->size(); ++i) {
    const DistillRecord& want = i < 8 ? (*a)[i] : (*b)[i - 8];
    EXPECT_EQ((*both)[i].prompt_len, want.prompt_len) << i;
    EXPECT_EQ((*both)[i].tokens, want.tokens) << i;
  }
  EXPECT_NE((*both)[8].tokens, (*both)[0].tokens);

  DrafterTrainingOptions listed = DrafterOptions("la", 2e-3);
  listed.distill_path = root_ + "/distill.bin," + root_ + "/distill-b.bin";
  auto trained = RunDrafterTraining(listed);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_TRUE(std::filesystem::exists(root_ + "/la/model.safetensors"));

  DrafterTrainingOptions missing = DrafterOptions("lb", 2e-3);
  missing.distill_path = root_ + "/distill.bin," + root_ + "/nowhere.bin";
  auto refused = RunDrafterTraining(missing);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(refused.status().message(), HasSubstr("nowhere.bin"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/lb/model.safetensors"));
  auto empty = ReadDistillFiles(root_ + "/distill.bin,");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("empty file name"));
}

TEST_F(TargetInitTest, DrafterGrowsDeeperDraftingTheSame) {
  ASSERT_NO_FATAL_FAILURE(MakeTargetAndDistill());
  auto trained = RunDrafterTraining(DrafterOptions("ga", 2e-3));
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto small = TrainableDrafter::Load(root_ + "/ga");
  ASSERT_TRUE(small.ok()) << small.status();
  const at::Tensor want = FixedBlockLogits(*small);

  auto grown = TrainableDrafter::Grow(*small, 3, /*seed=*/5);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_EQ(grown->config().layers.num_hidden_layers, 3);
  EXPECT_LT((FixedBlockLogits(*grown) - want).abs().max().item<double>(), 1e-4);
  // The old layer sits at 0; layers 1 and 2 are new, with fresh
  // projections but no output yet.
  EXPECT_TRUE(at::equal(Weight(*grown, "layers.0.mlp.up_proj.weight"),
                        Weight(*small, "layers.0.mlp.up_proj.weight")));
  EXPECT_TRUE(
      at::equal(Weight(*grown, "fc.weight"), Weight(*small, "fc.weight")));
  EXPECT_GT(Weight(*grown, "layers.2.self_attn.q_proj.weight")
                .abs()
                .max()
                .item<float>(),
            0.0f);
  EXPECT_EQ(
      Weight(*grown, "layers.2.mlp.down_proj.weight").abs().max().item<float>(),
      0.0f);
  EXPECT_FALSE(TrainableDrafter::Grow(*grown, 2, 5).ok());

  // Through the trainer: at lr 0 the export is the grown drafter itself;
  // at a real learning rate the new layers start to draft.
  DrafterTrainingOptions deeper = DrafterOptions("gb", 0.0);
  deeper.num_layers = 3;
  deeper.init_from = root_ + "/ga";
  auto deeper_run = RunDrafterTraining(deeper);
  ASSERT_TRUE(deeper_run.ok()) << deeper_run.status();
  auto exported = TrainableDrafter::Load(root_ + "/gb");
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->config().layers.num_hidden_layers, 3);
  EXPECT_LT((FixedBlockLogits(*exported) - want).abs().max().item<double>(),
            1e-4);
  DrafterTrainingOptions learning = DrafterOptions("gc", 2e-3);
  learning.num_layers = 3;
  learning.init_from = root_ + "/ga";
  auto learned = RunDrafterTraining(learning);
  ASSERT_TRUE(learned.ok()) << learned.status();
  auto moved = TrainableDrafter::Load(root_ + "/gc");
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_GT(
      Weight(*moved, "layers.2.mlp.down_proj.weight").abs().max().item<float>(),
      0.0f);
}

}  // namespace
}  // namespace dedit::training
