// `dedit-train drafter`: trains a DEdit drafter for a frozen target on the
// distilled data (docs/ARCHITECTURE.md §1-2).
//
// Per step: a few distilled sequences; the frozen target computes their
// context features; many blocks per sequence at random anchors inside the
// target-generated continuation (slot 0 = the anchor token, slot k predicts
// x[a+k], slot 0 is not trained). Pass P1 runs on [anchor, MASK...]; pass P2
// runs, with the same weights and the same context, on the ProposalMix input
// built from P1's argmax and confidence (proposal_mix.h). Loss =
// L(P1) + edit_loss_weight * L(P2), each the cross-entropy weighted per slot
// by exp(-(k-1)/gamma) (in P2, times edit_selected_weight at the slots
// whose input is the ground truth). The target's embedding and lm_head are
// frozen.
//
// Schedule (docs/log/2026-12-06-results-notebook.md, the DEdit drafter
// recipe):
//  * P1 alone first (`p1_only_steps` at most), until held-out slot-1
//    accuracy plateaus (gains under `plateau_delta` at `plateau_patience`
//    evaluations in a row); then P1 + P2 jointly. The switch step is kept in
//    the checkpoint.
//  * ProposalMix's eta adapts per batch (`gt_selection_ratio` > 0) so that
//    ground-truth selection stays at ratio x P1 accuracy (AdaptiveEta).
//  * The causal editor masks the edit pass only; P1 stays bidirectional.
//  * `train_windows` cycles the block length per step (e.g. 16,32), so one
//    block-32 drafter serves W = 16 and W = 32.
//
// Logged: both losses, the paper's ProposalMix rates (P1 accuracy, GT
// selection, overwrite) and eta, the edit pass's outcomes where it kept
// P1's guess (p2_fixed: a wrong guess made right, p2_broke: a right one
// made wrong), and on held-out sequences (`heldout_path`:
// another distill file, from held-out files and values; else the last
// records) the mean accepted length tau (bonus included) of P1, P2 and P3
// drafts against the ground truth per evaluation window, slot-1 P1
// accuracy, and the neighbour oracle: the editor's accuracy at a slot whose
// other slots hold the ground truth, against P1's there.
//
//   DrafterTrainingOptions o;  // target_dir, distill_path, out_dir, ...
//   ASSIGN_OR_RETURN(StageOutcome outcome, RunDrafterTraining(o));
#ifndef DEDIT_TRAINING_DRAFTER_TRAINER_H_
#define DEDIT_TRAINING_DRAFTER_TRAINER_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "training/distill.h"
#include "training/optimizer.h"
#include "training/progress.h"

namespace dedit::training {

struct DrafterTrainingOptions {
  std::string target_dir;    // exported target (frozen)
  std::string distill_path;  // from `dedit-train distill` (or a,b,...)
  std::string work_dir;      // state.safetensors, log.jsonl
  std::string out_dir;       // the exported drafter
  // Drafter shape: the target's layer shape with these overrides.
  int num_layers = 1;
  int intermediate_size = 0;  // 0 = the target's
  int block_size = 16;
  std::vector<int> target_layer_ids;  // empty = DefaultTargetLayerIds(L, 3)
  int num_passes = 3;                 // dedit_config.num_passes (inference K)
  // Block lengths cycled per step (empty = block_size); each <= block_size.
  std::vector<int> train_windows;
  // Objective.
  double gamma = 7.0;
  double eta = 0.5;               // fixed threshold when the ratio is 0
  double gt_selection_ratio = 0;  // > 0: adaptive eta (AdaptiveEta)
  int64_t p1_only_steps = 0;      // longest P1-only warm-up
  double plateau_delta = 0.01;    // slot-1 accuracy gain that still counts
  // Evaluations in a row under plateau_delta that end the warm-up; more
  // than one, so that a single noisy evaluation does not end it while the
  // accuracy is still rising.
  int plateau_patience = 2;
  bool proposal_mix = true;
  bool causal_editor = false;
  // > 0: lookup-seeded P1 (DrafterConfig::lookup_seed_ngram): P1 reads the
  // prompt lookup's proposal instead of masks, in training, evaluation and
  // the exported config.
  int lookup_seed_ngram = 0;
  // > 0 (seeded only): trust in the seed (DrafterConfig::seed_logit_bonus,
  // AddSeedTrust) in every pass's logits during training and evaluation,
  // and in the exported config, so that the network learns around it (for
  // one, to outvote junk seeds). 0: the bonus is fitted after training
  // (scripts/fit_seed_bonus.py).
  double seed_logit_bonus = 0;
  double edit_loss_weight = 1.0;
  // Weight of the edit loss at the slots whose ProposalMix input is the
  // ground truth (EditLossWeights); 1 = the paper's loss, 0 = the editor is
  // trained only where its input is P1's own guess.
  double edit_selected_weight = 1.0;
  // > 0: the edit pass's input takes the ground truth at a random share of
  // the slots (uniform per slot) instead of P1's confident ones; eta and
  // gt_selection_ratio are then not used. An oracle-like input: the editor
  // sees mostly right neighbours whatever P1's confidence.
  double edit_truth_share = 0;
  // With edit_truth_share > 0: the share of blocks (drawn per block and
  // step) that take that uniform ground truth; the others keep ProposalMix
  // by P1's confidence (eta or gt_selection_ratio). 1 = every block. A
  // blend: some blocks teach the editor to use right neighbours (what the
  // neighbour oracle asks), the rest its own confident draft (what it meets
  // at inference).
  double edit_truth_blocks = 1.0;
  // The share of each sequence's anchors taken where the engine's rounds
  // land (RoundAnchors: kRoundAnchorWalk rounds of the current drafter's P1
  // from uniform starts) instead of uniformly; 0 = all uniform.
  double round_anchor_share = 0;
  // Batch: sequences per step x blocks per sequence.
  int sequences_per_step = 4;
  int blocks_per_sequence = 32;
  int64_t steps = 1500;
  LearningRateSchedule schedule;
  AdamWOptions adamw;
  uint64_t seed = 3;
  double checkpoint_every_s = 300;
  double max_minutes = 0;
  int eval_every = 250;
  // An exported drafter whose weights the run starts from (fresh optimizer
  // and schedule), e.g. to train a shipped drafter further; its shape
  // (block size, feature layers, MLP) must be the one asked for, and a
  // drafter of fewer layers is grown (TrainableDrafter::Grow).
  std::string init_from;
  int heldout_sequences = 64;  // last records of the distill data, or
  std::string heldout_path;    // a held-out distill file (all of it)
  int heldout_blocks_per_sequence = 16;
  std::string export_dtype = "bfloat16";
};

absl::StatusOr<StageOutcome> RunDrafterTraining(
    const DrafterTrainingOptions& options);

// A batch of blocks over a few sequences (exposed for tests).
struct BlockBatch {
  at::Tensor ids;        // [S, T] int64, sequences padded with pad_id
  at::Tensor anchors;    // [S, NB] int64, positions of slot 0
  at::Tensor truth;      // [S, NB, W] int64: x[a + j] (pad_id past the end)
  at::Tensor valid;      // [S, NB, W-1] bool: a + k < length, k = 1..W-1
  at::Tensor p1_tokens;  // [S, NB, W] int64: [x[a], MASK x (W-1)]
};

// Builds blocks for `sequences` (prompt_len, tokens) with anchors drawn
// uniformly from [prompt_len, length - 2] (the target-generated part), or
// taken from `fixed_anchors` when it is non-empty (one list per sequence,
// each of size blocks_per_sequence).
BlockBatch MakeBlockBatch(
    const std::vector<const DistillRecord*>& sequences, int blocks_per_sequence,
    int window, int32_t mask_id, int32_t pad_id, std::mt19937_64* rng,
    const std::vector<std::vector<int64_t>>& fixed_anchors = {});

// Lookup-seeded P1 input (DrafterConfig::lookup_seed_ngram): rewrites
// batch->p1_tokens so that each block's slots 1..W-1 hold the prompt
// lookup's proposal over its sequence's tokens up to and including the
// anchor (what the engine knows when it drafts there), MASK past the
// proposal's end. `sequences` are the ones the batch was built from.
void SeedWithLookup(const std::vector<const DistillRecord*>& sequences,
                    int min_ngram, int32_t mask_id, BlockBatch* batch);

// tau as the engine counts it (Rounds::tau): each sequence's answer is walked
// round by round from its first generated token (position prompt_len), each
// block anchored where the previous round's tokens end, and tau is the tokens a
// round commits (the accepted draft tokens and the bonus, up to the end of
// the answer) over the rounds. `propose` returns the draft ([S, 1, W-1]
// token ids) for a batch of one block per sequence. Averaging blocks at
// uniformly drawn anchors instead (the held-out tau of the evaluations)
// weighs every position alike, while rounds crowd where drafts fail: a
// sequence half of whose positions accept 7 tokens and half none has that
// tau 4.5, and these rounds commit 200 tokens in 112.5 rounds, 1.78.
struct Rounds {
  double tokens = 0, rounds = 0;
  double tau() const { return rounds > 0 ? tokens / rounds : 0.0; }
};
Rounds WalkRounds(const std::vector<const DistillRecord*>& sequences,
                  int window, int32_t mask_id, int32_t pad_id,
                  const std::function<at::Tensor(const BlockBatch&)>& propose);

// On-policy anchors (DrafterTrainingOptions::round_anchor_share): walks
// `rounds` rounds from each of `starts` (per sequence, each list the same
// length) as the engine would, with `propose`'s drafts ([S, M, W-1] for M
// blocks per sequence; as WalkRounds), and returns where each walk's next
// round is anchored: right after a block of the drafter's that missed or
// was used up, as the engine's rounds are. Their spread over the answer
// stays that of the starts (a uniform start moved on), not the engine's,
// whose rounds pile up where each commits one token. A
// walk that runs past length - 2 is restarted at its start.
std::vector<std::vector<int64_t>> RoundAnchors(
    const std::vector<const DistillRecord*>& sequences,
    std::vector<std::vector<int64_t>> starts, int rounds, int window,
    int32_t mask_id, int32_t pad_id,
    const std::function<at::Tensor(const BlockBatch&)>& propose);

// The editing headroom of an exported drafter (docs/RESULTS.md, "Editing
// headroom"; `dedit-train headroom`): per slot k = 1..W-1 (index k-1) of
// blocks anchored along an answer (slot 0 the anchor token, as in
// training), over the slots inside the answer (`n`), the hits against the
// answer's own tokens of
//  * p1: P1's argmax;
//  * p2: the editor on P1's argmax (the second pass as run);
//  * left_oracle: the editor with the ground truth in slots 1..k-1 and P1's
//    argmax from slot k on (at slot 1 the same input as p2);
//  * full_oracle: the editor with the ground truth in every slot but k,
//    which keeps P1's argmax (the held-out neighbour oracle at every slot;
//    at slot W-1 the same input as left_oracle);
// and, summed over the same slots, each query's attention mass on the
// block's own keys (the rest is on the context), averaged over heads and
// layers, in P1 and in P2, and the mass uniform attention over the keys it
// sees would put there (W / (anchor + W)).
struct SlotHeadroom {
  explicit SlotHeadroom(int slots = 0);
  void Add(const SlotHeadroom& other);

  std::vector<double> n, p1, p2, left_oracle, full_oracle;
  std::vector<double> p1_block_share, p2_block_share, uniform_block_share;
};

// Scores each of `records` (prompt + answer) with the drafter exported at
// `drafter_dir` for the target at `target_dir`, in blocks of `window`
// (2..the drafter's block size) anchored every `anchor_stride` positions
// of the answer from its first token; one tally per record. The drafter's
// config decides the causal editor, the lookup seed and its trust.
absl::StatusOr<std::vector<SlotHeadroom>> MeasureHeadroom(
    const std::string& target_dir, const std::string& drafter_dir,
    const std::vector<const DistillRecord*>& records, int window,
    int anchor_stride);

// What a drafter proposes at every `anchor_stride`-th anchor of an answer
// (from its first token): each pass's greedy draft, each edit pass fed the
// previous pass's argmax as at inference, and the full neighbour oracle at
// every slot (the editor's argmax at slot k when every other slot holds
// the ground truth and slot k P1's argmax). A block holds W-1 slots; past
// the end of the answer a slot's draft means nothing.
struct BlockDrafts {
  std::vector<int64_t> anchors;
  std::vector<std::vector<std::vector<int32_t>>> passes;  // [pass][block][slot]
  std::vector<std::vector<int32_t>> oracle;               // [block][slot]
};

// The edit passes' mask: as the drafter was trained (its config), or
// causal or bidirectional whatever it was trained with (the ablation on
// the same weights).
enum class EditMask { kAsTrained, kCausal, kBidirectional };

// BlockDrafts of each of `records` with `passes` passes (1..8), as
// MeasureHeadroom scores them.
absl::StatusOr<std::vector<BlockDrafts>> DraftBlocks(
    const std::string& target_dir, const std::string& drafter_dir,
    const std::vector<const DistillRecord*>& records, int window,
    int anchor_stride, int passes, EditMask mask);

// The end of the P1-only warm-up: `patience` evaluations in a row whose
// held-out slot-1 accuracy gained less than `delta` over the one before.
struct PlateauRule {
  double delta = 0.01;
  int patience = 2;
  int64_t flat = 0;  // evaluations in a row under delta so far
  double last = -1;  // the previous evaluation's accuracy (-1: none yet)

  // Records an evaluation; true once the accuracy has plateaued.
  bool Update(double accuracy) {
    if (last >= 0) flat = accuracy - last < delta ? flat + 1 : 0;
    last = accuracy;
    return flat >= patience;
  }
};

}  // namespace dedit::training

#endif  // DEDIT_TRAINING_DRAFTER_TRAINER_H_
