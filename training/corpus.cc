#include "training/corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/file_util.h"
#include "common/base/model_config.h"
#include "common/base/status.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace dedit::training {
namespace {

namespace fs = std::filesystem;

constexpr char kCacheMagic[8] = {'D', 'E', 'D', 'T', 'O', 'K', '0', '1'};

uint64_t FileListHash(const std::vector<CorpusFile>& files, CorpusSplit split,
                      uint64_t tokenizer_hash, int32_t eot_id) {
  std::string key = absl::StrCat(tokenizer_hash, ":", eot_id, ":");
  for (const CorpusFile& f : files) {
    if (f.split == split) absl::StrAppend(&key, f.path, "#", f.bytes, ";");
  }
  return Fnv1a(key);
}

}  // namespace

uint64_t Fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

absl::StatusOr<std::vector<CorpusFile>> ListCorpusFiles(
    const CorpusSpec& spec) {
  std::vector<CorpusFile> files;
  for (const std::string& root : spec.roots) {
    std::error_code ec;
    if (!fs::is_directory(root, ec)) {
      return absl::NotFoundError(
          absl::StrCat("corpus root ", root, " is not a directory"));
    }
    fs::recursive_directory_iterator it(
        root, fs::directory_options::skip_permission_denied, ec),
        end;
    for (; it != end; it.increment(ec)) {
      if (ec) break;
      const fs::path& p = it->path();
      if (it->is_directory(ec)) {
        const std::string name = p.filename().string();
        if (std::find(spec.exclude_dirs.begin(), spec.exclude_dirs.end(),
                      name) != spec.exclude_dirs.end()) {
          it.disable_recursion_pending();
        }
        continue;
      }
      if (!it->is_regular_file(ec)) continue;
      const std::string path = p.string();
      bool match = false;
      for (const std::string& suffix : spec.suffixes) {
        match = match || absl::EndsWith(path, suffix);
      }
      if (!match) continue;
      const int64_t bytes = static_cast<int64_t>(it->file_size(ec));
      if (ec || bytes == 0 || bytes > spec.max_file_bytes) continue;
      CorpusFile f;
      f.path = path;
      f.bytes = bytes;
      f.split =
          spec.heldout_every > 0 &&
                  Fnv1a(path) % static_cast<uint64_t>(spec.heldout_every) == 0
              ? CorpusSplit::kHeldOut
              : CorpusSplit::kTrain;
      files.push_back(std::move(f));
    }
  }
  if (files.empty()) return absl::NotFoundError("no corpus files matched");
  std::sort(
      files.begin(), files.end(),
      [](const CorpusFile& a, const CorpusFile& b) { return a.path < b.path; });
  return files;
}

absl::StatusOr<std::string> ReadCorpusText(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  if (!ValidateUtf8(text).ok()) return std::string();
  return text;
}

absl::StatusOr<TokenStream> LoadOrBuildTokenStream(
    const std::vector<CorpusFile>& files, CorpusSplit split,
    const Tokenizer& tokenizer, uint64_t tokenizer_hash, int32_t eot_id,
    const std::string& cache_path) {
  const uint64_t hash = FileListHash(files, split, tokenizer_hash, eot_id);
  {
    std::ifstream in(cache_path, std::ios::binary);
    char magic[8];
    uint64_t stored_hash = 0, docs = 0, n = 0;
    if (in.read(magic, 8) && std::equal(magic, magic + 8, kCacheMagic) &&
        in.read(reinterpret_cast<char*>(&stored_hash), 8) &&
        stored_hash == hash && in.read(reinterpret_cast<char*>(&docs), 8) &&
        in.read(reinterpret_cast<char*>(&n), 8)) {
      TokenStream stream;
      stream.num_documents = static_cast<int64_t>(docs);
      stream.tokens.resize(n);
      if (in.read(reinterpret_cast<char*>(stream.tokens.data()),
                  static_cast<std::streamsize>(n * sizeof(int32_t)))) {
        return stream;
      }
    }
  }
  TokenStream stream;
  for (const CorpusFile& f : files) {
    if (f.split != split) continue;
    ASSIGN_OR_RETURN(std::string text, ReadCorpusText(f.path));
    if (text.empty()) continue;
    EncodeOptions options;
    options.split_special_tokens = true;  // corpus text never holds controls
    auto ids = tokenizer.Encode(text, options);
    if (!ids.ok()) return Annotate(ids.status(), f.path);
    stream.tokens.insert(stream.tokens.end(), ids->begin(), ids->end());
    stream.tokens.push_back(eot_id);
    ++stream.num_documents;
  }
  const uint64_t docs = static_cast<uint64_t>(stream.num_documents);
  const uint64_t n = stream.tokens.size();
  RETURN_IF_ERROR(WriteFileAtomically(
      cache_path,
      {absl::string_view(kCacheMagic, 8),
       absl::string_view(reinterpret_cast<const char*>(&hash), 8),
       absl::string_view(reinterpret_cast<const char*>(&docs), 8),
       absl::string_view(reinterpret_cast<const char*>(&n), 8),
       absl::string_view(reinterpret_cast<const char*>(stream.tokens.data()),
                         n * sizeof(int32_t))}));
  return stream;
}

namespace {

// Calls `fn(line_no, text)` for every instance of a chat task file.
absl::Status ForEachChatTask(
    const std::string& jsonl_path,
    const std::function<absl::Status(int64_t, const std::string&)>& fn) {
  ASSIGN_OR_RETURN(std::string content, ReadFileToString(jsonl_path));
  int64_t line_no = 0, instances = 0;
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    ++line_no;
    if (line.empty()) continue;
    const nlohmann::json instance =
        nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!instance.is_object() || !instance.contains("text") ||
        !instance["text"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(jsonl_path, ":", line_no,
                       ": not a chat task instance (an object with \"text\")"));
    }
    RETURN_IF_ERROR(fn(line_no, instance["text"].get<std::string>()));
    ++instances;
  }
  if (instances == 0) {
    return absl::NotFoundError(
        absl::StrCat(jsonl_path, " holds no chat task instances"));
  }
  return absl::OkStatus();
}

// Where the answer starts in a rendered instance: just after its assistant
// header, where a chat client's prompt ends.
absl::StatusOr<size_t> AnswerOffset(const std::string& jsonl_path,
                                    int64_t line_no, absl::string_view text) {
  static constexpr absl::string_view kAssistant = "<|im_start|>assistant\n";
  const size_t at = text.find(kAssistant);
  if (at == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        jsonl_path, ":", line_no, ": no assistant turn in \"text\""));
  }
  return at + kAssistant.size();
}

}  // namespace

absl::StatusOr<TokenStream> TokenizeChatTasks(const std::string& jsonl_path,
                                              const Tokenizer& tokenizer,
                                              int32_t eot_id) {
  TokenStream stream;
  RETURN_IF_ERROR(ForEachChatTask(jsonl_path, [&](int64_t line_no,
                                                  const std::string& text) {
    ASSIGN_OR_RETURN(const size_t answer_at,
                     AnswerOffset(jsonl_path, line_no, text));
    const absl::string_view view(text);
    for (const bool answer : {false, true}) {
      auto ids = tokenizer.Encode(answer ? view.substr(answer_at)
                                         : view.substr(0, answer_at));
      if (!ids.ok()) {
        return Annotate(ids.status(), absl::StrCat(jsonl_path, ":", line_no));
      }
      stream.tokens.insert(stream.tokens.end(), ids->begin(), ids->end());
      stream.loss_mask.insert(stream.loss_mask.end(), ids->size(),
                              answer ? 1 : 0);
    }
    stream.tokens.push_back(eot_id);
    stream.loss_mask.push_back(1);
    ++stream.num_documents;
    return absl::OkStatus();
  }));
  return stream;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> ChatTaskPrompts(
    const std::string& jsonl_path, const Tokenizer& tokenizer) {
  std::vector<std::vector<int32_t>> prompts;
  RETURN_IF_ERROR(ForEachChatTask(jsonl_path, [&](int64_t line_no,
                                                  const std::string& text) {
    ASSIGN_OR_RETURN(const size_t answer_at,
                     AnswerOffset(jsonl_path, line_no, text));
    auto ids = tokenizer.Encode(absl::string_view(text).substr(0, answer_at));
    if (!ids.ok()) {
      return Annotate(ids.status(), absl::StrCat(jsonl_path, ":", line_no));
    }
    prompts.push_back(std::move(*ids));
    return absl::OkStatus();
  }));
  return prompts;
}

}  // namespace dedit::training
