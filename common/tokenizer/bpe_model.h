// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}): the
// vocabulary, the ranked merges, and the per-word merge loop with a bounded
// result cache.
//
// Merges are accepted in both serialisations HF writes: "a b" strings (older
// files, exactly one space) and ["a", "b"] pairs (newer files, Qwen3). They
// are kept in a hash map keyed by the pair of token ids, so the merge loop
// never builds strings. A word is merged HF-style: repeatedly apply the
// lowest-ranked adjacent pair, leftmost first among equal ranks.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<BpeModel> bpe,
//                    BpeModel::FromJson(doc["model"]));
//   std::vector<int32_t> ids;
//   bpe->Tokenize("Ġworld", &ids);
//
// Thread-safe: Tokenize is const; the cache is sharded and locked inside.
#ifndef DEDIT_TOKENIZER_BPE_MODEL_H_
#define DEDIT_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace dedit {

class BpeModel {
 public:
  // Words longer than this (bytes) are merged every time instead of cached;
  // they are rare and would crowd out the common ones. Same bound as HF.
  static constexpr size_t kMaxCachedWordBytes = 256;
  // Default number of cached words, all shards together.
  static constexpr size_t kDefaultCacheCapacity = 1 << 16;

  // Builds the model from the "model" object of a tokenizer.json.
  // INVALID_ARGUMENT, naming the field, for: a type other than BPE, missing
  // or malformed vocab/merges, a merge whose parts or result are not in the
  // vocabulary, an unk_token not in the vocabulary, and options this
  // implementation does not support (dropout, byte_fallback,
  // continuing_subword_prefix, end_of_word_suffix).
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(
      const nlohmann::json& model,
      size_t cache_capacity = kDefaultCacheCapacity);

  // Appends the ids of one pre-tokenized word (valid UTF-8). Characters that
  // are not in the vocabulary become unk_token when there is one and are
  // dropped otherwise (HF's behaviour; byte-level vocabularies cover every
  // byte, so this never happens for them).
  void Tokenize(absl::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(absl::string_view token) const;
  // The token string of `id`, or nullptr when no vocabulary entry has it.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id in the vocabulary.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }
  size_t vocab_size() const { return token_to_id_.size(); }
  size_t merge_count() const { return merges_.size(); }

 private:
  struct Merge {
    uint32_t rank;
    int32_t merged_id;
  };
  static constexpr size_t kShards = 16;
  struct CacheShard {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> words
        ABSL_GUARDED_BY(mu);
  };

  BpeModel() = default;
  void MergeWord(absl::string_view word, std::vector<int32_t>* ids) const;
  const Merge* FindMerge(int32_t left, int32_t right) const {
    auto it = merges_.find((static_cast<uint64_t>(left) << 32) |
                           static_cast<uint32_t>(right));
    return it == merges_.end() ? nullptr : &it->second;
  }

  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> id_present_;
  // Id of each single-character token for code points below this bound,
  // -1 when absent; ByteLevel words only use U+0021..U+0143.
  static constexpr char32_t kDirectCharLimit = 0x800;
  std::vector<int32_t> char_to_id_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  size_t shard_capacity_ = 0;
  mutable std::array<CacheShard, kShards> cache_;
};

}  // namespace dedit

#endif  // DEDIT_TOKENIZER_BPE_MODEL_H_
