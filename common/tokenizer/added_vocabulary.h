// Added tokens of a tokenizer.json ("added_tokens"): control tokens such as
// <|im_start|> and <think> that are matched in the raw text *before*
// normalization and pre-tokenization, so that they are never split.
//
// Matching is HF's: leftmost match, longest pattern at that position; a
// match that a flag rejects (single_word) is skipped and scanning resumes
// after it. lstrip / rstrip widen an accepted match over adjacent Unicode
// whitespace, which is then part of the token. Tokens with normalized=false
// are matched in the original text; tokens with normalized=true are matched
// in normalized text, against their normalized content.
//
//   AddedVocabulary added(tokens);
//   std::vector<AddedVocabulary::Segment> segments;
//   added.Split("a<|im_end|>b", AddedVocabulary::kRawText,
//               /*split_special_tokens=*/false, &segments);
//   // {0,1,-1} {1,11,151645} {11,12,-1}
//
// Immutable after construction; thread-safe.
#ifndef DEDIT_TOKENIZER_ADDED_VOCABULARY_H_
#define DEDIT_TOKENIZER_ADDED_VOCABULARY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace dedit {

// The longest added-token pattern (content, or normalized content) a
// tokenizer may have. Matching walks a trie from every candidate position,
// so it costs O(text bytes x longest pattern): with this bound, 1 MB of text
// is matched in well under a second whatever the tokenizer. Real added
// tokens are under 40 bytes (<|im_start|>, <|reserved_special_token_250|>).
inline constexpr size_t kMaxAddedTokenBytes = 256;

// One entry of "added_tokens" (HF's AddedToken).
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;      // Skipped by Decode(skip_special_tokens).
  bool single_word = false;  // Only matches between non-word characters.
  bool lstrip = false;       // Absorbs whitespace on its left.
  bool rstrip = false;       // Absorbs whitespace on its right.
  bool normalized = false;   // Matched after normalization.
};

class AddedVocabulary {
 public:
  enum Pass { kRawText, kNormalizedText };

  // A stretch of the input: either text (token_id == -1) or one added token.
  struct Segment {
    size_t begin;
    size_t end;
    int32_t token_id;
  };

  // `tokens` must hold only non-empty contents, and every pattern should be
  // at most kMaxAddedTokenBytes long (Tokenizer::Load refuses longer ones;
  // longer ones still match, only slower). `normalized_contents[i]` is
  // the pattern used for tokens[i] when it is `normalized` (the caller
  // normalizes it); it is ignored for other tokens.
  AddedVocabulary(std::vector<AddedToken> tokens,
                  std::vector<std::string> normalized_contents);
  ~AddedVocabulary();
  AddedVocabulary(const AddedVocabulary&) = delete;
  AddedVocabulary& operator=(const AddedVocabulary&) = delete;

  // Covers `text` with segments in order; text segments are never empty.
  // `pass` selects which tokens take part (normalized=false ones on raw
  // text, normalized=true ones on normalized text). With
  // `split_special_tokens`, tokens flagged special are not matched (their
  // text is tokenized as ordinary text), as HF's encode_special_tokens.
  void Split(absl::string_view text, Pass pass, bool split_special_tokens,
             std::vector<Segment>* segments) const;

  bool HasTokensFor(Pass pass) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Trie;
  // Longest pattern of `pass` starting at text[pos], as an index into
  // tokens_ (its byte length in *length), or -1.
  int LongestMatchAt(absl::string_view text, size_t pos, Pass pass,
                     size_t* length) const;

  std::vector<AddedToken> tokens_;
  std::unique_ptr<Trie> tries_[2];
};

}  // namespace dedit

#endif  // DEDIT_TOKENIZER_ADDED_VOCABULARY_H_
