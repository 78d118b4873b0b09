// `dedit-train headroom` (training/headroom.h) on the shipped tiny pair and
// a handful of hand-made answers: answers find their task family by prompt,
// the counts are the slots inside the answers, the oracles that share an
// input agree, the attention shares are shares, and a rerun repeats every
// number. The attention probe leaves the drafter's logits as they were.
#include "training/headroom.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/base/file_util.h"
#include "common/tokenizer/tokenizer.h"
#include "training/corpus.h"
#include "training/distill.h"
#include "training/drafter_trainer.h"
#include "training/trainable_models.h"

namespace dedit::training {
namespace {

const std::string kTiny = std::string(DEDIT_SOURCE_DIR) + "/checkpoints/tiny";
constexpr int kWindow = 8;

std::string TempDir() {
  char tmpl[] = "/tmp/dedit_headroom_test_XXXXXX";
  const char* dir = mkdtemp(tmpl);
  EXPECT_NE(dir, nullptr);
  return dir;
}

struct Task {
  std::string family, user, answer;
};

const std::vector<Task>& Tasks() {
  static const std::vector<Task> tasks = {
      {"add", "Add 12 and 34.", "A=12 B=34. 2+4+0=06 1+3+0=04. A+B=046"},
      {"sort", "Sort: pear fig apple.", "apple fig pear"},
      {"add", "Add 7 and 85.", "A=7 B=85. 7+5+0=12 0+8+1=09. A+B=092"},
  };
  return tasks;
}

std::string ChatText(const Task& t, bool with_answer) {
  std::string text =
      "<|im_start|>user\n" + t.user + "<|im_end|>\n<|im_start|>assistant\n";
  return with_answer ? text + t.answer + "<|im_end|>\n" : text;
}

// A task jsonl of Tasks() and a distill file answering tasks 0, 1, 2 and 0
// again (the distill stage repeats instances); the answers' token counts.
class HeadroomTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    auto tokenizer = Tokenizer::FromFile(kTiny + "/target/tokenizer.json");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    std::string jsonl;
    for (const Task& t : Tasks()) {
      jsonl += nlohmann::json{{"family", t.family}, {"text", ChatText(t, true)}}
                   .dump() +
               "\n";
    }
    ASSERT_TRUE(WriteFileAtomically(dir_ + "/tasks.jsonl", jsonl).ok());
    std::string bytes("DEDDIS01", 8);
    for (const int i : {0, 1, 2, 0}) {
      auto prompt = (*tokenizer)->Encode(ChatText(Tasks()[i], false));
      auto answer = (*tokenizer)->Encode(Tasks()[i].answer + "<|im_end|>");
      ASSERT_TRUE(prompt.ok() && answer.ok());
      std::vector<int32_t> tokens = *prompt;
      tokens.insert(tokens.end(), answer->begin(), answer->end());
      const uint32_t header[2] = {static_cast<uint32_t>(prompt->size()),
                                  static_cast<uint32_t>(tokens.size())};
      bytes.append(reinterpret_cast<const char*>(header), sizeof(header));
      bytes.append(reinterpret_cast<const char*>(tokens.data()),
                   tokens.size() * sizeof(int32_t));
      if (answer_lengths_.size() < 3) answer_lengths_.push_back(answer->size());
    }
    ASSERT_TRUE(WriteFileAtomically(dir_ + "/answers.bin", bytes).ok());
  }

  HeadroomOptions Options() const {
    HeadroomOptions o;
    o.target_dir = kTiny + "/target";
    o.drafter_dir = kTiny + "/drafter";
    o.data_path = dir_ + "/answers.bin";
    o.tasks_path = dir_ + "/tasks.jsonl";
    o.window = kWindow;
    return o;
  }

  // Slot k (1..W-1) is scored once per anchor a in [0, L-2] of an answer of
  // L tokens with a + k < L.
  double ExpectedSlots(int k, const std::vector<size_t>& answers) const {
    double n = 0;
    for (size_t len : answers) {
      for (size_t a = 0; a + 2 <= len; ++a) n += a + k < len ? 1 : 0;
    }
    return n;
  }

  std::string dir_;
  std::vector<size_t> answer_lengths_;
};

TEST_F(HeadroomTest, FamiliesCountsOraclesAndSharesHold) {
  auto report = RunHeadroom(Options());
  ASSERT_TRUE(report.ok()) << report.status();
  const nlohmann::json& r = *report;
  EXPECT_EQ(r["records"], 4);
  EXPECT_EQ(r["repeated_records"], 1);
  EXPECT_EQ(r["repeats_differing"], 0);
  EXPECT_EQ(r["families"]["add"]["instances"], 2);
  EXPECT_EQ(r["families"]["sort"]["instances"], 1);
  EXPECT_EQ(r["all"]["instances"], 3);
  const std::vector<std::pair<std::string, std::vector<size_t>>> groups = {
      {"add", {answer_lengths_[0], answer_lengths_[2]}},
      {"sort", {answer_lengths_[1]}},
  };
  for (const auto& [family, lengths] : groups) {
    const nlohmann::json& slot = r["families"][family]["per_slot"];
    ASSERT_EQ(slot["n"].size(), kWindow - 1u);
    for (int k = 1; k < kWindow; ++k) {
      EXPECT_EQ(slot["n"][k - 1].get<double>(), ExpectedSlots(k, lengths))
          << family << " slot " << k;
    }
  }
  for (const std::string name : {"add", "sort"}) {
    const nlohmann::json& s = r["families"][name]["per_slot"];
    // Slot 1's left oracle is the editor on P1's argmax; at slot W-1 the
    // left oracle already sees every other slot's ground truth.
    EXPECT_EQ(s["left_oracle"][0], s["p2"][0]) << name;
    EXPECT_EQ(s["full_oracle"][kWindow - 2], s["left_oracle"][kWindow - 2])
        << name;
    for (const std::string m :
         {"p1", "p2", "left_oracle", "full_oracle", "p1_block_share",
          "p2_block_share", "uniform_block_share"}) {
      for (const auto& v : s[m]) {
        EXPECT_GE(v.get<double>(), 0.0) << name << " " << m;
        EXPECT_LE(v.get<double>(), 1.0 + 1e-9) << name << " " << m;
      }
    }
  }
  // The answers of one family add up to "all".
  const auto& all_n = r["all"]["per_slot"]["n"];
  EXPECT_EQ(all_n[0].get<double>(),
            ExpectedSlots(1, {answer_lengths_[0], answer_lengths_[1],
                              answer_lengths_[2]}));
  auto again = RunHeadroom(Options());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->dump(), r.dump());
}

// `dedit-train drafts` (DraftBlocks) drafts what the headroom scores: per
// answer, P1's, P2's and the full oracle's hits at its slots equal
// MeasureHeadroom's, an anchor per answer position, every pass a full block;
// the causal mask changes the edit passes only, and the bidirectional one
// is what the drafter was trained with.
TEST_F(HeadroomTest, DraftsAgreeWithTheHeadroom) {
  auto records = ReadDistillData(dir_ + "/answers.bin");
  ASSERT_TRUE(records.ok()) << records.status();
  std::vector<const DistillRecord*> seqs;
  for (int i = 0; i < 3; ++i) seqs.push_back(&(*records)[i]);
  const std::string target = kTiny + "/target", drafter = kTiny + "/drafter";
  auto tallies = MeasureHeadroom(target, drafter, seqs, kWindow, 1);
  auto drafts =
      DraftBlocks(target, drafter, seqs, kWindow, 1, 3, EditMask::kAsTrained);
  auto same = DraftBlocks(target, drafter, seqs, kWindow, 1, 3,
                          EditMask::kBidirectional);
  auto causal =
      DraftBlocks(target, drafter, seqs, kWindow, 1, 3, EditMask::kCausal);
  ASSERT_TRUE(tallies.ok() && drafts.ok() && same.ok() && causal.ok());
  bool edits_differ = false;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DistillRecord& r = *seqs[i];
    const BlockDrafts& d = (*drafts)[i];
    ASSERT_EQ(d.anchors.size(), answer_lengths_[i] - 1);
    ASSERT_EQ(d.passes.size(), 3u);
    ASSERT_EQ(d.oracle.size(), d.anchors.size());
    std::vector<double> p1(kWindow - 1), p2(kWindow - 1), oracle(kWindow - 1);
    for (size_t b = 0; b < d.anchors.size(); ++b) {
      EXPECT_EQ(d.anchors[b], r.prompt_len + static_cast<int64_t>(b));
      for (int k = 1; k < kWindow; ++k) {
        const size_t at = d.anchors[b] + k;
        if (at >= r.tokens.size()) continue;
        p1[k - 1] += d.passes[0][b][k - 1] == r.tokens[at];
        p2[k - 1] += d.passes[1][b][k - 1] == r.tokens[at];
        oracle[k - 1] += d.oracle[b][k - 1] == r.tokens[at];
      }
      for (int p = 0; p < 3; ++p) {
        ASSERT_EQ(d.passes[p][b].size(), kWindow - 1u);
        EXPECT_EQ((*same)[i].passes[p][b], d.passes[p][b]);
      }
      EXPECT_EQ((*causal)[i].passes[0][b], d.passes[0][b]);
      edits_differ |= (*causal)[i].passes[1][b] != d.passes[1][b];
    }
    EXPECT_EQ(p1, (*tallies)[i].p1) << "answer " << i;
    EXPECT_EQ(p2, (*tallies)[i].p2) << "answer " << i;
    EXPECT_EQ(oracle, (*tallies)[i].full_oracle) << "answer " << i;
  }
  EXPECT_TRUE(edits_differ) << "the causal mask changed no edit pass";
  EXPECT_EQ(
      DraftBlocks(target, drafter, seqs, kWindow, 1, 0, EditMask::kAsTrained)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_F(HeadroomTest, AnAnswerToNoTaskIsRefused) {
  const Task other = {"add", "Add 1 and 1.", "A=1 B=1. A+B=2"};
  std::string jsonl =
      nlohmann::json{{"family", "add"}, {"text", ChatText(other, true)}}
          .dump() +
      "\n";
  ASSERT_TRUE(WriteFileAtomically(dir_ + "/other.jsonl", jsonl).ok());
  HeadroomOptions o = Options();
  o.tasks_path = dir_ + "/other.jsonl";
  auto report = RunHeadroom(o);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
}

// The attention probe: logits unchanged bit for bit, shares in [0, 1], and
// a block anchored at position 0 (no context to see) wholly on itself.
TEST_F(HeadroomTest, BlockShareLeavesLogitsAndIsAShare) {
  at::NoGradGuard no_grad;
  auto target = TrainableTarget::Load(kTiny + "/target");
  auto drafter = TrainableDrafter::Load(kTiny + "/drafter");
  ASSERT_TRUE(target.ok() && drafter.ok());
  const std::vector<int64_t> seq = {5, 9,  40, 41, 42, 7,  9,  40, 100, 3,
                                    8, 77, 12, 13, 14, 15, 16, 17, 18,  19};
  at::Tensor features;
  target->Forward(at::tensor(seq, at::kLong).view({1, -1}),
                  drafter->config().target_layer_ids, &features);
  const DrafterContext ctx = drafter->ProjectContext(features);
  const at::Tensor anchors =
      at::tensor(std::vector<int64_t>{0, 4, 9}, at::kLong).view({1, 3});
  const at::Tensor tokens =
      ((at::arange(3 * kWindow, at::kLong) * 37 + 11) % 2000)
          .view({1, 3, kWindow});
  for (const bool causal : {false, true}) {
    const at::Tensor plain =
        drafter->BlockLogits(ctx, tokens, anchors, causal,
                             target->embed_tokens(), target->lm_head());
    at::Tensor share;
    const at::Tensor probed =
        drafter->BlockLogits(ctx, tokens, anchors, causal,
                             target->embed_tokens(), target->lm_head(), &share);
    EXPECT_TRUE(at::equal(plain, probed));
    ASSERT_EQ(share.sizes(), (at::IntArrayRef{1, 3, kWindow}));
    EXPECT_TRUE(share.ge(0).all().item<bool>());
    EXPECT_TRUE(share.le(1 + 1e-6).all().item<bool>());
    EXPECT_TRUE(at::allclose(share[0][0], at::ones({kWindow})));
    EXPECT_LT(share[0][2].mean().item<double>(), 0.999);
  }
}

}  // namespace
}  // namespace dedit::training
