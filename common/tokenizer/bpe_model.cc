#include "common/tokenizer/bpe_model.h"

#include <algorithm>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/base/bounded_json.h"
#include "common/base/status.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/utf8.h"

namespace dedit {
namespace {

// Ids index dense tables; a hostile file must not make us allocate
// gigabytes. 2^24 is over 100x the largest vocabularies in use.
constexpr int32_t kMaxTokenId = (1 << 24) - 1;

absl::Status RejectOption(const nlohmann::json& model, const char* key,
                          const char* why) {
  auto it = model.find(key);
  if (it == model.end() || it->is_null()) return absl::OkStatus();
  if (it->is_string() && it->get<std::string>().empty()) {
    return absl::OkStatus();
  }
  if (it->is_boolean() && !it->get<bool>()) return absl::OkStatus();
  if (it->is_number() && it->get<double>() == 0.0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "model.", key, ": ", JsonForError(*it), " is not supported (", why, ")"));
}

// Splits one merges entry into its two token strings.
absl::Status ParseMergeEntry(const nlohmann::json& entry, size_t index,
                             std::string* left, std::string* right) {
  if (entry.is_string()) {
    const std::string& s = entry.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space == std::string::npos ||
        s.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.merges[", index, "]: \"", s,
                       "\" must be two tokens separated by exactly one space"));
    }
    *left = s.substr(0, space);
    *right = s.substr(space + 1);
    return absl::OkStatus();
  }
  if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
      entry[1].is_string()) {
    *left = entry[0].get<std::string>();
    *right = entry[1].get<std::string>();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "model.merges[", index, "]: expected \"a b\" or [\"a\", \"b\"], got ",
      JsonForError(entry)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(
    const nlohmann::json& model, size_t cache_capacity) {
  if (!model.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: expected an object, got ", model.type_name()));
  }
  auto type = model.find("type");
  if (type != model.end() && !(type->is_string() && *type == "BPE")) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.type: ", JsonForError(*type),
                     " is not supported (only BPE models are)"));
  }
  RETURN_IF_ERROR(
      RejectOption(model, "dropout", "BPE dropout is for training"));
  RETURN_IF_ERROR(RejectOption(model, "byte_fallback",
                               "byte-level vocabularies cover every byte"));
  RETURN_IF_ERROR(RejectOption(model, "continuing_subword_prefix",
                               "not used by byte-level BPE"));
  RETURN_IF_ERROR(
      RejectOption(model, "end_of_word_suffix", "not used by byte-level BPE"));

  std::unique_ptr<BpeModel> bpe(new BpeModel());
  ASSIGN_OR_RETURN(bpe->fuse_unk_,
                   JsonOptionalBool(model, "fuse_unk", false, "model"));
  ASSIGN_OR_RETURN(bpe->ignore_merges_,
                   JsonOptionalBool(model, "ignore_merges", false, "model"));

  auto vocab = model.find("vocab");
  if (vocab == model.end() || vocab->is_null()) {
    return absl::InvalidArgumentError("model.vocab: missing");
  }
  if (!vocab->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.vocab: expected an object (token -> id), got ",
                     vocab->type_name()));
  }
  if (vocab->empty()) return absl::InvalidArgumentError("model.vocab: empty");
  bpe->token_to_id_.reserve(vocab->size());
  int32_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    ASSIGN_OR_RETURN(int32_t id,
                     JsonToTokenId(it.value(), absl::StrCat("model.vocab[\"",
                                                            it.key(), "\"]")));
    if (id > kMaxTokenId) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.vocab[\"", it.key(), "\"]: id ", id,
                       " exceeds the supported maximum ", kMaxTokenId));
    }
    absl::Status utf8 = ValidateUtf8(it.key());
    if (!utf8.ok()) return Annotate(utf8, "model.vocab key");
    bpe->token_to_id_.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  bpe->id_to_token_.resize(static_cast<size_t>(max_id) + 1);
  bpe->id_present_.assign(static_cast<size_t>(max_id) + 1, false);
  bpe->char_to_id_.assign(kDirectCharLimit, -1);
  for (const auto& [token, id] : bpe->token_to_id_) {
    // Several tokens may share an id; keep the first one seen, as the
    // reverse map of any such file is ambiguous anyway.
    if (!bpe->id_present_[id]) {
      bpe->id_to_token_[id] = token;
      bpe->id_present_[id] = true;
    }
    if (!token.empty()) {
      const Utf8Sequence seq = DecodeUtf8Sequence(token);
      if (seq.length == token.size() && seq.code_point < kDirectCharLimit) {
        bpe->char_to_id_[seq.code_point] = id;
      }
    }
  }

  auto unk = model.find("unk_token");
  if (unk != model.end() && !unk->is_null()) {
    if (!unk->is_string()) {
      return absl::InvalidArgumentError("model.unk_token: expected a string");
    }
    auto it = bpe->token_to_id_.find(unk->get<std::string>());
    if (it == bpe->token_to_id_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.unk_token: '", unk->get<std::string>(),
                       "' is not in the vocabulary"));
    }
    bpe->unk_id_ = it->second;
  }

  auto merges = model.find("merges");
  if (merges == model.end() || merges->is_null()) {
    return absl::InvalidArgumentError("model.merges: missing");
  }
  if (!merges->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.merges: expected an array, got ", merges->type_name()));
  }
  bpe->merges_.reserve(merges->size());
  std::string left, right;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    RETURN_IF_ERROR(ParseMergeEntry((*merges)[rank], rank, &left, &right));
    auto left_it = bpe->token_to_id_.find(left);
    auto right_it = bpe->token_to_id_.find(right);
    for (const auto* part : {&left, &right}) {
      if (bpe->token_to_id_.find(*part) == bpe->token_to_id_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("model.merges[", rank, "]: token '", *part,
                         "' is not in the vocabulary"));
      }
    }
    auto merged_it = bpe->token_to_id_.find(left + right);
    if (merged_it == bpe->token_to_id_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.merges[", rank, "]: merged token '", left, right,
                       "' is not in the vocabulary"));
    }
    const uint64_t key = (static_cast<uint64_t>(left_it->second) << 32) |
                         static_cast<uint32_t>(right_it->second);
    // A repeated pair takes its later rank, as HF's map insertion does.
    bpe->merges_[key] = Merge{static_cast<uint32_t>(rank), merged_it->second};
  }

  bpe->shard_capacity_ = cache_capacity / kShards;
  return bpe;
}

std::optional<int32_t> BpeModel::TokenToId(absl::string_view token) const {
  auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() ||
      !id_present_[id]) {
    return nullptr;
  }
  return &id_to_token_[id];
}

void BpeModel::Tokenize(absl::string_view word,
                        std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = token_to_id_.find(word);
    if (it != token_to_id_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable =
      shard_capacity_ > 0 && word.size() <= kMaxCachedWordBytes;
  if (!cacheable) {
    MergeWord(word, ids);
    return;
  }
  CacheShard& shard = cache_[absl::Hash<absl::string_view>{}(word) % kShards];
  {
    absl::ReaderMutexLock lock(&shard.mu);
    auto it = shard.words.find(word);
    if (it != shard.words.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  MergeWord(word, ids);
  std::vector<int32_t> merged(ids->begin() + first, ids->end());
  absl::MutexLock lock(&shard.mu);
  // Dropping the whole shard when it is full keeps the bound without LRU
  // bookkeeping on the hot path; common words come back within a few calls.
  if (shard.words.size() >= shard_capacity_) shard.words.clear();
  shard.words.emplace(std::string(word), std::move(merged));
}

void BpeModel::MergeWord(absl::string_view word,
                         std::vector<int32_t>* ids) const {
  struct Symbol {
    int32_t id;  // -1 once merged into its left neighbour.
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&symbols](int32_t id) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, -1});
  };

  // Initial symbols: one per character; unknown characters become unk
  // (consecutive ones fused into one when fuse_unk) or are dropped.
  bool pending_unk = false;
  for (size_t i = 0; i < word.size();) {
    const Utf8Sequence seq = DecodeUtf8Sequence(word.substr(i));
    const size_t length = seq.kind == Utf8SequenceKind::kValid ? seq.length : 1;
    int32_t id = -1;
    if (seq.kind == Utf8SequenceKind::kValid &&
        seq.code_point < kDirectCharLimit) {
      id = char_to_id_[seq.code_point];
    } else {
      auto it = token_to_id_.find(word.substr(i, length));
      if (it != token_to_id_.end()) id = it->second;
    }
    i += length;
    if (id >= 0) {
      if (pending_unk) add(*unk_id_);
      pending_unk = false;
      add(id);
    } else if (unk_id_.has_value()) {
      if (pending_unk && !fuse_unk_) add(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) add(*unk_id_);
  if (symbols.empty()) return;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    symbols[i].next = static_cast<int32_t>(i + 1);
  }

  // A queued merge. `order` packs (rank, left index) so that one integer
  // comparison gives HF's order: lowest rank first, then leftmost.
  struct Candidate {
    uint64_t order;
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
  };
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.order > b.order;
  };
  std::vector<Candidate> heap;
  heap.reserve(symbols.size());
  // Appends the merge of two adjacent symbols, if there is one.
  auto queue = [&](int32_t left, int32_t right) {
    const Merge* m = FindMerge(symbols[left].id, symbols[right].id);
    if (m == nullptr) return false;
    heap.push_back(
        {(static_cast<uint64_t>(m->rank) << 32) | static_cast<uint32_t>(left),
         right, symbols[left].id, symbols[right].id, m->merged_id});
    return true;
  };
  auto consider = [&](int32_t left, int32_t right) {
    if (queue(left, right)) std::push_heap(heap.begin(), heap.end(), later);
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    queue(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
  }
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    const int32_t left_index = static_cast<int32_t>(c.order & 0xFFFFFFFFu);
    Symbol& left = symbols[left_index];
    // Stale candidates: a side was merged since the pair was queued. Symbols
    // only grow, so unchanged ids at adjacent positions mean the same pair.
    if (left.id != c.left_id || left.next != c.right ||
        symbols[c.right].id != c.right_id) {
      continue;
    }
    Symbol& right = symbols[c.right];
    left.id = c.merged_id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = left_index;
    right.id = -1;
    if (left.prev >= 0) consider(left.prev, left_index);
    if (left.next >= 0) consider(left_index, left.next);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next)
    ids->push_back(symbols[i].id);
}

}  // namespace dedit
