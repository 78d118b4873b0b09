// Incremental detokenization for streaming generation: token ids go in one
// at a time, and only complete UTF-8 text comes out.
//
// A multi-byte character often spans several byte-level tokens (an emoji
// is 4 bytes, commonly 2-3 tokens). Push() appends the token's bytes and
// returns everything up to the last character boundary; a trailing
// incomplete-but-valid sequence (at most 3 bytes) is held back until the
// next token completes it. Bytes that can never become valid UTF-8 are
// emitted immediately as U+FFFD (one per maximal ill-formed subpart).
//
// Flush() ends the stream: held-back bytes (a character cut off by the end
// of generation, e.g. at max_tokens) are emitted as ONE U+FFFD, and the
// detokenizer is reset for reuse.
//
// Invariant: the concatenation of all Push() results and the final Flush()
// equals Tokenizer::Decode() of the same ids with the same options.
//
//   StreamingDetokenizer detok(tokenizer.get());
//   for (int32_t id : generated) {
//     ASSIGN_OR_RETURN(std::string delta, detok.Push(id));
//     if (!delta.empty()) SendToClient(delta);
//   }
//   SendToClient(detok.Flush());
//
// Not thread-safe: one instance per stream. The Tokenizer must outlive it.
#ifndef DEDIT_TOKENIZER_STREAMING_DETOKENIZER_H_
#define DEDIT_TOKENIZER_STREAMING_DETOKENIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace dedit {

class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer* tokenizer,
                                DecodeOptions options = {});

  // Adds one token and returns the text it completed (possibly empty).
  // INVALID_ARGUMENT for an id outside the vocabulary; the stream is left
  // as it was, so the caller may skip the id and continue.
  absl::StatusOr<std::string> Push(int32_t id);

  // Returns the held-back bytes as U+FFFD ("" when nothing is pending) and
  // resets the stream.
  std::string Flush();

  // Number of bytes currently held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  DecodeOptions options_;
  std::string pending_;  // An incomplete UTF-8 sequence.
};

}  // namespace dedit

#endif  // DEDIT_TOKENIZER_STREAMING_DETOKENIZER_H_
