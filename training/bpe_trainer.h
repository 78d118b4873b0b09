// Trains a byte-level BPE tokenizer with Qwen3's pre-tokenizer and writes a
// HuggingFace tokenizer.json that common/tokenizer/tokenizer.h (and HF
// tokenizers) load.
//
// Pipeline, the same one the tokenizer applies when encoding: NFC, Split by
// Qwen's regex (Isolated), ByteLevel (no prefix space). Words are counted,
// every byte starts as its own symbol (ids 0..255 in byte order, in the
// ByteLevel alphabet), and the most frequent adjacent pair is merged until
// the vocabulary is full (ties: the pair of smaller ids). Special tokens
// take the ids after the BPE vocabulary.
//
//   BpeTrainer trainer(BpeTrainerOptions{.vocab_size = 2048});
//   for (const std::string& text : documents)
//   RETURN_IF_ERROR(trainer.AddText(text)); ASSIGN_OR_RETURN(std::string json,
//   trainer.Train());
#ifndef DEDIT_TRAINING_BPE_TRAINER_H_
#define DEDIT_TRAINING_BPE_TRAINER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "training/corpus.h"

namespace dedit {
class Normalizer;
class PreTokenizer;
}  // namespace dedit

namespace dedit::training {

struct BpeTrainerOptions {
  // Total ids including the special tokens.
  int vocab_size = 2048;
  // Pairs seen fewer times than this are never merged.
  int64_t min_pair_count = 2;
  // Added tokens (special, not normalized), ids vocab_size - n .. vocab_size-1
  // in this order.
  std::vector<std::string> special_tokens = {"<|endoftext|>", "<|im_start|>",
                                             "<|im_end|>", "<|mask|>"};
};

class BpeTrainer {
 public:
  explicit BpeTrainer(BpeTrainerOptions options);
  ~BpeTrainer();

  // Counts the words of `text` (valid UTF-8; INVALID_ARGUMENT otherwise).
  absl::Status AddText(const std::string& text);
  // Learns the merges and returns the tokenizer.json text.
  absl::StatusOr<std::string> Train();

  int64_t num_words() const {
    return static_cast<int64_t>(word_counts_.size());
  }

 private:
  absl::Status EnsurePipeline();

  BpeTrainerOptions options_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  absl::flat_hash_map<std::string, int64_t> word_counts_;
};

// The Qwen3 pre-tokenizer regex (the Split pattern of Qwen3's tokenizer.json).
extern const char kQwenSplitPattern[];

// `dedit-train tokenizer`: trains on the train split of `corpus` and writes
// `out_path` (tokenizer.json).
absl::Status TrainCorpusTokenizer(const CorpusSpec& corpus,
                                  const BpeTrainerOptions& options,
                                  const std::string& out_path);

}  // namespace dedit::training

#endif  // DEDIT_TRAINING_BPE_TRAINER_H_
