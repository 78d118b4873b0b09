// What a round asks of a drafter and what it gets back, independent of where
// the drafter runs (in process: common/model/dedit_drafter.h; across services:
// the router's RemoteDrafter over dedit.v1.Drafter). Torch-free.
//
//   DraftRequest r{.sequence = id, .start = n, .bonus = t, .window = 16,
//                  .passes = 3};
//   // DraftResult::passes.back().tokens is the proposal for slots 1..W-1.
#ifndef DEDIT_ENGINE_DRAFT_H_
#define DEDIT_ENGINE_DRAFT_H_

#include <cstdint>
#include <vector>

namespace dedit {

// A sequence's id inside one engine (the router widens it on the wire, see
// router/remote_verifier.h).
using SequenceId = uint64_t;

struct DraftRequest {
  SequenceId sequence = 0;
  // Committed tokens; must equal the sequence's context length. The block
  // sits at positions start .. start + window - 1.
  int64_t start = 0;
  int32_t bonus = 0;  // block slot 0: the last token the target produced
  int window = 16;    // W: block size, W-1 proposed tokens
  int passes = 1;     // K: P1 + (K-1) edit passes
  // The sequence's known tokens (prompt + output so far, start + 1 of them,
  // ending with the bonus), owned by the engine and valid during the Draft
  // call. Model-free drafters (common/engine/ngram_drafter.h) read them; model
  // drafters have the target's features instead and ignore them.
  const std::vector<int32_t>* tokens = nullptr;
  // For a lookup-seeded drafter (Drafter::lookup_seed_ngram() > 0): P1's
  // block input for slots 1..W-1, the prompt lookup's proposal over
  // `known` (common/engine/ngram_drafter.h LookupSeedOptions; at most W-1
  // tokens, MASK after them). The engine fills it; empty = masks.
  std::vector<int32_t> seed = {};
};

// One pass's proposal for block slots 1..W-1.
struct DraftPass {
  std::vector<int32_t> tokens;
  std::vector<float> confidences;  // max softmax probability per slot
};

struct DraftResult {
  std::vector<DraftPass> passes;  // K entries; the last is the proposal
};

}  // namespace dedit

#endif  // DEDIT_ENGINE_DRAFT_H_
