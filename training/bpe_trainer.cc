#include "training/bpe_trainer.h"

#include <iostream>
#include <nlohmann/json.hpp>
#include <queue>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/status.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "training/progress.h"

namespace dedit::training {

const char kQwenSplitPattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

namespace {

using Json = nlohmann::ordered_json;

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) |
         static_cast<uint32_t>(b);
}

Json ByteLevelStep() {
  return Json{{"type", "ByteLevel"},
              {"add_prefix_space", false},
              {"trim_offsets", false},
              {"use_regex", false}};
}

Json SplitStep() {
  return Json{{"type", "Split"},
              {"pattern", {{"Regex", kQwenSplitPattern}}},
              {"behavior", "Isolated"},
              {"invert", false}};
}

// Adds `sign * count` for every adjacent pair of `symbols`.
void CountPairs(const std::vector<int32_t>& symbols, int64_t count,
                absl::flat_hash_map<uint64_t, int64_t>* deltas) {
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    (*deltas)[PairKey(symbols[i], symbols[i + 1])] += count;
  }
}

}  // namespace

BpeTrainer::BpeTrainer(BpeTrainerOptions options)
    : options_(std::move(options)) {}
BpeTrainer::~BpeTrainer() = default;

absl::Status BpeTrainer::EnsurePipeline() {
  if (pre_tokenizer_ != nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(normalizer_,
                   ParseNormalizer(nlohmann::json{{"type", "NFC"}}));
  // The Split step alone: ByteLevel without regex only maps bytes, which the
  // trainer does itself (symbol id = byte value).
  ASSIGN_OR_RETURN(
      pre_tokenizer_,
      ParsePreTokenizer(nlohmann::json::parse(SplitStep().dump())));
  return absl::OkStatus();
}

absl::Status BpeTrainer::AddText(const std::string& text) {
  RETURN_IF_ERROR(EnsurePipeline());
  RETURN_IF_ERROR(ValidateUtf8(text));
  std::vector<std::string> pieces = {text};
  RETURN_IF_ERROR(normalizer_->Normalize(&pieces[0]));
  RETURN_IF_ERROR(pre_tokenizer_->PreTokenize(&pieces));
  for (std::string& piece : pieces) ++word_counts_[piece];
  return absl::OkStatus();
}

absl::StatusOr<std::string> BpeTrainer::Train() {
  const int num_special = static_cast<int>(options_.special_tokens.size());
  const int bpe_vocab = options_.vocab_size - num_special;
  if (bpe_vocab < 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size ", options_.vocab_size,
                     " leaves no room for the 256 bytes and ", num_special,
                     " special tokens"));
  }
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  std::vector<std::string> token_strings;
  absl::flat_hash_map<std::string, int32_t> token_ids;
  for (int b = 0; b < 256; ++b) {
    token_strings.emplace_back(alphabet.Encode(static_cast<uint8_t>(b)));
    token_ids[token_strings.back()] = b;
  }

  // Words in a fixed order (sorted) so that training is deterministic.
  std::vector<std::pair<std::string, int64_t>> sorted(word_counts_.begin(),
                                                      word_counts_.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  for (const auto& [word, count] : sorted) {
    std::vector<int32_t> symbols;
    for (unsigned char ch : word) symbols.push_back(ch);
    words.push_back(std::move(symbols));
    counts.push_back(count);
  }

  absl::flat_hash_map<uint64_t, int64_t> pair_counts;
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<int32_t>> pair_words;
  for (size_t w = 0; w < words.size(); ++w) {
    CountPairs(words[w], counts[w], &pair_counts);
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      pair_words[PairKey(words[w][i], words[w][i + 1])].insert(
          static_cast<int32_t>(w));
    }
  }
  // Max-heap on (count, then smaller ids first); stale entries (count no
  // longer current) are skipped when popped.
  using Entry = std::tuple<int64_t, int32_t, int32_t>;  // count, -a, -b
  std::priority_queue<Entry> heap;
  for (const auto& [key, count] : pair_counts) {
    heap.emplace(count, -static_cast<int32_t>(key >> 32),
                 -static_cast<int32_t>(key & 0xffffffffu));
  }

  std::vector<std::pair<int32_t, int32_t>> merges;
  while (static_cast<int>(token_strings.size()) < bpe_vocab && !heap.empty()) {
    auto [count, neg_a, neg_b] = heap.top();
    heap.pop();
    const int32_t a = -neg_a, b = -neg_b;
    const uint64_t key = PairKey(a, b);
    auto current = pair_counts.find(key);
    if (current == pair_counts.end() || current->second != count) continue;
    if (count < options_.min_pair_count) break;
    merges.emplace_back(a, b);
    const std::string merged = token_strings[a] + token_strings[b];
    int32_t z;
    auto existing = token_ids.find(merged);
    if (existing != token_ids.end()) {
      z = existing->second;
    } else {
      z = static_cast<int32_t>(token_strings.size());
      token_strings.push_back(merged);
      token_ids[merged] = z;
    }
    absl::flat_hash_map<uint64_t, int64_t> deltas;
    const absl::flat_hash_set<int32_t> affected = std::move(pair_words[key]);
    pair_words.erase(key);
    for (int32_t w : affected) {
      std::vector<int32_t>& symbols = words[w];
      std::vector<int32_t> next;
      next.reserve(symbols.size());
      bool changed = false;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
          next.push_back(z);
          ++i;
          changed = true;
        } else {
          next.push_back(symbols[i]);
        }
      }
      if (!changed) continue;
      CountPairs(symbols, -counts[w], &deltas);
      CountPairs(next, counts[w], &deltas);
      for (size_t i = 0; i + 1 < next.size(); ++i) {
        const uint64_t k = PairKey(next[i], next[i + 1]);
        if (k != key) pair_words[k].insert(w);
      }
      symbols = std::move(next);
    }
    for (const auto& [k, delta] : deltas) {
      if (delta == 0) continue;
      int64_t& c = pair_counts[k];
      c += delta;
      if (c <= 0) {
        pair_counts.erase(k);
      } else {
        heap.emplace(c, -static_cast<int32_t>(k >> 32),
                     -static_cast<int32_t>(k & 0xffffffffu));
      }
    }
    pair_counts.erase(key);
  }

  Json vocab = Json::object();
  for (size_t i = 0; i < token_strings.size(); ++i) {
    vocab[token_strings[i]] = static_cast<int>(i);
  }
  Json merge_list = Json::array();
  for (const auto& [a, b] : merges) {
    merge_list.push_back(Json::array({token_strings[a], token_strings[b]}));
  }
  Json added = Json::array();
  for (int i = 0; i < num_special; ++i) {
    added.push_back(Json{{"id", static_cast<int>(token_strings.size()) + i},
                         {"content", options_.special_tokens[i]},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", true}});
  }
  Json doc;
  doc["version"] = "1.0";
  doc["truncation"] = nullptr;
  doc["padding"] = nullptr;
  doc["added_tokens"] = added;
  doc["normalizer"] = Json{{"type", "NFC"}};
  doc["pre_tokenizer"] =
      Json{{"type", "Sequence"},
           {"pretokenizers", Json::array({SplitStep(), ByteLevelStep()})}};
  doc["post_processor"] = ByteLevelStep();
  doc["decoder"] = ByteLevelStep();
  doc["model"] = Json{{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"continuing_subword_prefix", ""},
                      {"end_of_word_suffix", ""},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"ignore_merges", false},
                      {"vocab", vocab},
                      {"merges", merge_list}};
  return doc.dump(1) + "\n";
}

absl::Status TrainCorpusTokenizer(const CorpusSpec& corpus,
                                  const BpeTrainerOptions& options,
                                  const std::string& out_path) {
  ASSIGN_OR_RETURN(std::vector<CorpusFile> files, ListCorpusFiles(corpus));
  BpeTrainer trainer(options);
  int64_t bytes = 0, used = 0;
  for (const CorpusFile& f : files) {
    if (f.split != CorpusSplit::kTrain) continue;
    ASSIGN_OR_RETURN(std::string text, ReadCorpusText(f.path));
    if (text.empty()) continue;
    RETURN_IF_ERROR(Annotate(trainer.AddText(text), f.path));
    bytes += static_cast<int64_t>(text.size());
    ++used;
  }
  std::cerr << absl::StrFormat(
      "[tokenizer] %d files, %d bytes, %d distinct words; learning merges\n",
      used, bytes, trainer.num_words());
  ASSIGN_OR_RETURN(std::string json, trainer.Train());
  RETURN_IF_ERROR(WriteFileAtomically(out_path, json));
  std::cerr << "[tokenizer] wrote " << out_path << "\n";
  return absl::OkStatus();
}

}  // namespace dedit::training
