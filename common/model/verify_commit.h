// The lossless step after a target forward (docs/ARCHITECTURE.md §1 steps 5-6),
// written once for the in-process verifier (common/model/local_backends.h) and
// the target service's model thread (target_service/target_worker.h).
//
// For a verify block [bonus, draft...] run as segment i of a forward:
//   1. the target chooses a token at every slot (greedy or sampled);
//   2. acc = AcceptedPrefixLength(draft, choices);
//   3. the KV cache is truncated to start + acc + 1 committed tokens;
//   4. the committed rows' context features go to the sink.
// For a prefill chunk: its features go to the sink, and the last chunk of a
// prompt samples the first output token.
//
//   ASSIGN_OR_RETURN(TargetForwardResult out, model.Forward(segments));
//   ASSIGN_OR_RETURN(VerifyOutcome o,
//                    CommitVerifyBlock(out, i, work, sampler, model, sink));
#ifndef DEDIT_MODEL_VERIFY_COMMIT_H_
#define DEDIT_MODEL_VERIFY_COMMIT_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "common/engine/round_interfaces.h"
#include "common/model/context_sink.h"
#include "common/model/qwen3_model.h"
#include "common/model/sampling.h"

namespace dedit {

// `segment` is the index of `work`'s block in the forward, which asked for
// logits at every block row. `sink` may be null (no drafter to feed). On
// error the cache may hold the whole block: the caller fails the sequence.
absl::StatusOr<VerifyOutcome> CommitVerifyBlock(
    const TargetForwardResult& forward, size_t segment, const VerifyWork& work,
    TokenSampler& sampler, Qwen3Model& model, ContextSink* sink);

// A prefill chunk of `length` tokens at `start`, run as segment `segment`.
// When `last` (the forward asked for the logits of its final row), returns
// the first output token; otherwise std::nullopt.
absl::StatusOr<std::optional<int32_t>> CommitPrefillChunk(
    const TargetForwardResult& forward, size_t segment, SequenceId sequence,
    int64_t start, int64_t length, bool last, TokenSampler& sampler,
    ContextSink* sink);

}  // namespace dedit

#endif  // DEDIT_MODEL_VERIFY_COMMIT_H_
