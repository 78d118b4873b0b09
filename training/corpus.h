// The training corpus: text files under a few roots (e.g. the Python
// standard library and its documentation, as Debian installs them), split
// into train and held-out *by file*, and their token streams cached on disk.
//
// A file is held out iff FNV-1a(its path) % heldout_every == 0, so the split
// is stable across machines that install the same packages. Documents are
// joined with the end-of-text token.
//
//   CorpusSpec spec{.roots = {"/usr/lib/python3.11"}, .suffixes = {".py"}};
//   ASSIGN_OR_RETURN(std::vector<CorpusFile> files, ListCorpusFiles(spec));
//   ASSIGN_OR_RETURN(TokenStream train,
//                    LoadOrBuildTokenStream(files, CorpusSplit::kTrain,
//                                           tokenizer, Fnv1a(json), eot_id,
//                                           cache_path));
#ifndef DEDIT_TRAINING_CORPUS_H_
#define DEDIT_TRAINING_CORPUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dedit {
class Tokenizer;
}

namespace dedit::training {

struct CorpusSpec {
  std::vector<std::string> roots;
  // A file is taken when its name ends with one of these.
  std::vector<std::string> suffixes = {".py", ".rst.txt"};
  // Directories skipped anywhere below a root (test suites, duplicated
  // documentation such as pydoc_data, third-party packages).
  std::vector<std::string> exclude_dirs = {
      "__pycache__", "test",          "tests",        "idle_test",
      "pydoc_data",  "site-packages", "dist-packages"};
  int heldout_every = 20;
  // Files larger than this are skipped (generated tables, not prose/code).
  int64_t max_file_bytes = 512 * 1024;
};

enum class CorpusSplit { kTrain, kHeldOut };

struct CorpusFile {
  std::string path;
  int64_t bytes = 0;
  CorpusSplit split = CorpusSplit::kTrain;
};

// Every matching file under the roots, sorted by path. NOT_FOUND when a
// root is missing or nothing matches.
absl::StatusOr<std::vector<CorpusFile>> ListCorpusFiles(const CorpusSpec& spec);

// Reads a file; files that are not valid UTF-8 yield an empty string.
absl::StatusOr<std::string> ReadCorpusText(const std::string& path);

// A split's tokens, documents separated by `eot_id`.
struct TokenStream {
  std::vector<int32_t> tokens;
  int64_t num_documents = 0;
  // Per token: 1 when the model is trained to predict it. Empty = every
  // token. Chat tasks train on answers only (see TokenizeChatTasks).
  std::vector<uint8_t> loss_mask;
};

// Tokenizes the files of `split` (or loads `cache_path` when it exists and
// was made from the same file list and `tokenizer_hash`, e.g. Fnv1a of the
// tokenizer.json text) and writes the cache.
absl::StatusOr<TokenStream> LoadOrBuildTokenStream(
    const std::vector<CorpusFile>& files, CorpusSplit split,
    const Tokenizer& tokenizer, uint64_t tokenizer_hash, int32_t eot_id,
    const std::string& cache_path);

// The chat task suite (training/chat_tasks.py): every line of `jsonl_path`
// is an instance whose "text" is a rendered conversation; each becomes a
// document of the stream (special tokens such as <|im_start|> are
// recognised, unlike in corpus text). The prompt (through the assistant
// header) and the answer are tokenized apart, exactly as a chat client's
// prompt is, and `loss_mask` marks the answer, its <|im_end|> and the rest
// of the instance: the target is trained on answers only, as in supervised
// fine-tuning, because the prompts' random operands and words are noise that
// would otherwise take most of the loss. INVALID_ARGUMENT naming the line
// for a malformed instance; NOT_FOUND when the file is missing or has none.
absl::StatusOr<TokenStream> TokenizeChatTasks(const std::string& jsonl_path,
                                              const Tokenizer& tokenizer,
                                              int32_t eot_id);

// The prompts of the same instances: each "text" cut after the assistant
// header ("<|im_start|>assistant\n"), tokenized; what a chat client sends.
absl::StatusOr<std::vector<std::vector<int32_t>>> ChatTaskPrompts(
    const std::string& jsonl_path, const Tokenizer& tokenizer);

// 64-bit FNV-1a, the split's hash.
uint64_t Fnv1a(const std::string& text);

}  // namespace dedit::training

#endif  // DEDIT_TRAINING_CORPUS_H_
