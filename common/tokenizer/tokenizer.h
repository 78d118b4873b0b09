// Byte-level BPE tokenizer loaded from a HuggingFace tokenizer.json (the
// Qwen2/Qwen3 and GPT-2 family), bit-exact with HF `tokenizers`.
//
// Encode pipeline (HF's, in order):
//   1. the input must be valid UTF-8 (see "Invalid input" below);
//   2. added tokens with normalized=false (<|im_start|>, <think>, ...) are
//      cut out of the raw text, longest match first (added_vocabulary.h);
//   3. each stretch of text between them is normalized (NFC for Qwen),
//      then searched for added tokens with normalized=true;
//   4. each remaining stretch is pre-tokenized (Qwen: Split with the file's
//      regex, then ByteLevel), and
//   5. every pre-token is merged by the BPE model (cached per word).
// Decode maps ids to tokens, undoes the ByteLevel mapping, and converts the
// bytes to text replacing ill-formed UTF-8 with U+FFFD, as HF does. No
// BOS/EOS is ever added: the Qwen post-processor adds nothing.
//
// Invalid input:
//   - Encode: text that is not well-formed UTF-8 is rejected with
//     INVALID_ARGUMENT "invalid UTF-8 at byte offset N (byte 0xXX)", where
//     N is the offset of the first ill-formed sequence. Nothing is replaced
//     silently: a prompt is never changed behind the caller's back.
//   - Decode: an id outside the vocabulary is INVALID_ARGUMENT naming the id
//     and its position (HF skips such ids silently).
//   - FromFile/FromJson: malformed JSON (with line/column), an unsupported
//     model/normalizer/pre-tokenizer/decoder type, missing vocab or merges,
//     a merge naming an unknown token, or a regex that does not compile are
//     INVALID_ARGUMENT naming the field (e.g. "model.merges[17]: token 'xy'
//     is not in the vocabulary"); a missing file is NOT_FOUND.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok,
//                    Tokenizer::FromFile("/models/qwen3/tokenizer.json"));
//   ASSIGN_OR_RETURN(std::vector<int32_t> ids,
//                    tok->Encode("Hello, my dog is cute"));
//   // ids == {9707, 11, 847, 5562, 374, 18838}
//   ASSIGN_OR_RETURN(std::string text, tok->Decode(ids));
//
// Thread-safety: a loaded Tokenizer is immutable except for an internally
// synchronized cache; all const methods may be called concurrently.
#ifndef DEDIT_TOKENIZER_TOKENIZER_H_
#define DEDIT_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/tokenizer/added_vocabulary.h"

namespace dedit {

class BpeModel;
class Normalizer;
class PreTokenizer;

struct EncodeOptions {
  // When true, added tokens flagged "special" (<|im_start|>, <|endoftext|>,
  // ...) are not recognised: their characters are tokenized as plain text.
  // Use it for untrusted content that must not inject control tokens.
  // Non-special added tokens (<think>, <tool_call>) are still matched. The
  // default is HF's (special tokens in the text are matched).
  bool split_special_tokens = false;
};

struct DecodeOptions {
  // Drop tokens flagged "special" from the output (HF's
  // skip_special_tokens).
  bool skip_special_tokens = false;
};

class Tokenizer {
 public:
  // Loads a tokenizer.json. See "Invalid input" above for the errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(
      const std::string& path);
  // Same, from the file's contents.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      absl::string_view json_text);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`; the empty string gives no ids.
  absl::StatusOr<std::vector<int32_t>> Encode(
      absl::string_view text, const EncodeOptions& options = {}) const;

  // Text of `ids`; always valid UTF-8.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     const DecodeOptions& options = {}) const;

  // The bytes that token `id` contributes to Decode() before the UTF-8
  // conversion; one token may hold part of a multi-byte character. The
  // view stays valid for the Tokenizer's lifetime. INVALID_ARGUMENT for an
  // unknown id.
  absl::StatusOr<absl::string_view> TokenBytes(int32_t id) const;

  // Id of a vocabulary token or added-token content ("Ġworld",
  // "<|im_end|>"), or nullopt.
  std::optional<int32_t> TokenToId(absl::string_view token) const;
  // The token string (in the ByteLevel alphabet for model tokens), or
  // nullopt for an unknown id.
  std::optional<std::string> IdToToken(int32_t id) const;
  // Whether `id` is an added token flagged special.
  bool IsSpecialToken(int32_t id) const;
  // One past the largest id (model vocabulary and added tokens): 151669 for
  // Qwen3. Ids below it may still be unused.
  int32_t vocab_size() const { return vocab_size_; }
  const std::vector<AddedToken>& added_tokens() const {
    return added_->tokens();
  }

 private:
  Tokenizer();
  absl::Status Load(absl::string_view json_text);
  absl::Status EncodeText(absl::string_view text, const EncodeOptions& options,
                          std::vector<int32_t>* ids) const;
  absl::Status EncodeNormalized(absl::string_view text,
                                std::vector<int32_t>* ids) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Normalizer> normalizer_;       // May be null.
  std::unique_ptr<PreTokenizer> pre_tokenizer_;  // May be null.
  std::unique_ptr<AddedVocabulary> added_;
  // Added-token content -> id and id -> content, for the accessors.
  absl::flat_hash_map<std::string, int32_t> added_token_ids_;
  absl::flat_hash_map<int32_t, std::string> added_token_contents_;
  int32_t vocab_size_ = 0;
  // Decoded bytes of every id, packed: id i owns
  // token_bytes_[token_offsets_[i], token_offsets_[i + 1]).
  std::string token_bytes_;
  std::vector<uint32_t> token_offsets_;
  // Per id: bit 0 = id exists, bit 1 = special added token.
  std::vector<uint8_t> id_flags_;
};

}  // namespace dedit

#endif  // DEDIT_TOKENIZER_TOKENIZER_H_
