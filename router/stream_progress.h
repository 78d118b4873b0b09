// What the client of one Generate stream has received so far, kept apart
// from the stack that serves it, so that the stream can move to another
// stack mid-way (failover, router/stack_set.h) and go on as if nothing had
// happened: no gap in token indices, no text twice, stop strings still
// matched across the move, acceptance statistics of every stack it ran on.
//
// A stack that takes a moved stream prefills the prompt followed by every
// token already emitted (ResumedEngineRequest) and continues from the next
// one. That token is the one the old stack would have produced: at
// temperature 0 the target's rows are row-invariant (a prefill row and a
// decode row at the same position sum the same, common/model/cpu/
// cpu_panels.h), and a sampled token's draw depends on (seed, position)
// only (common/model/sampling.h); the seed is drawn at admission when the
// client gave none, and travels with the request.
//
//   auto stream = std::make_shared<StreamProgress>();  // at admission
//   stream->emitted.push_back(token);                   // as tokens stream
//   GenerationRequest next = ResumedEngineRequest(request.engine, *stream);
//
// Owned by one loop thread at a time (the stream's current stack).
#ifndef DEDIT_ROUTER_STREAM_PROGRESS_H_
#define DEDIT_ROUTER_STREAM_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/engine/generation_request.h"
#include "common/engine/speculative_engine.h"
#include "common/tokenizer/streaming_detokenizer.h"

namespace dedit {

struct StreamProgress {
  // Every token id sent to the client (the engine's output, stop token
  // excluded), in order.
  std::vector<int32_t> emitted;
  // Text: detokenized so far (cut at a stop string), and how much of it
  // was sent; the rest is held back while it could become a stop string.
  std::unique_ptr<StreamingDetokenizer> detokenizer;  // null: ids only
  std::string text;
  size_t sent_bytes = 0;
  size_t max_stop_bytes = 0;
  bool stopped_by_string = false;
  std::string stop_reason;
  // The rounds it ran on stacks it left (the final acceptance statistics
  // add the current stack's).
  std::vector<RoundRecord> rounds;
  std::optional<std::chrono::steady_clock::time_point> first_token_time;
  std::chrono::steady_clock::time_point last_token_time;
  // A session turn that moved: its history's KV was rebuilt elsewhere.
  bool cache_lost = false;
  // Set while it is between stacks: why it left the last one (the
  // dedit_stream_resumed_total reason) and when; cleared by the first
  // token after the move.
  std::string move_reason;
  std::chrono::steady_clock::time_point left_at;
};

// Why a stream left its stack, as the metric's reason label.
inline constexpr char kMoveTargetFailed[] = "target_failed";
inline constexpr char kMoveStackLeft[] = "stack_left";
inline constexpr char kMoveKvFull[] = "kv_full";

// The engine request that continues `original` after `progress`: the
// prompt followed by every emitted token, and the tokens still allowed.
// A session turn's kept sequence is not continued (it was on the old
// stack, or its KV went with the target); the turn's KV is rebuilt.
GenerationRequest ResumedEngineRequest(const GenerationRequest& original,
                                       const StreamProgress& progress);

}  // namespace dedit

#endif  // DEDIT_ROUTER_STREAM_PROGRESS_H_
