#include "training/distill.h"

#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/base/file_util.h"
#include "common/base/model_config.h"
#include "common/base/status.h"
#include "common/model/in_process.h"
#include "common/tokenizer/tokenizer.h"

namespace dedit::training {
namespace {

constexpr char kMagic[8] = {'D', 'E', 'D', 'D', 'I', 'S', '0', '1'};

// Writes records after the complete ones already in `path` (dropping a torn
// tail), creating the file with its magic when needed.
absl::Status AppendRecords(const std::string& path, int64_t keep_bytes,
                           const std::vector<DistillRecord>& records) {
  if (keep_bytes == 0) {
    RETURN_IF_ERROR(
        WriteFileAtomically(path, absl::string_view(kMagic, sizeof(kMagic))));
    keep_bytes = sizeof(kMagic);
  }
  if (::truncate(path.c_str(), keep_bytes) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("cannot truncate ", path));
  }
  std::string bytes;
  for (const DistillRecord& r : records) {
    const uint32_t header[2] = {static_cast<uint32_t>(r.prompt_len),
                                static_cast<uint32_t>(r.tokens.size())};
    bytes.append(reinterpret_cast<const char*>(header), sizeof(header));
    bytes.append(reinterpret_cast<const char*>(r.tokens.data()),
                 r.tokens.size() * sizeof(int32_t));
  }
  return AppendToFile(path, bytes);
}

// Reads complete records; `valid_bytes` receives the offset after the last.
absl::StatusOr<std::vector<DistillRecord>> ReadRecords(const std::string& path,
                                                       int64_t* valid_bytes) {
  std::vector<DistillRecord> records;
  *valid_bytes = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return records;
  char magic[8];
  if (!in.read(magic, 8) || !std::equal(magic, magic + 8, kMagic)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not distill data"));
  }
  *valid_bytes = 8;
  while (true) {
    uint32_t header[2];
    if (!in.read(reinterpret_cast<char*>(header), sizeof(header))) break;
    DistillRecord r;
    r.prompt_len = static_cast<int32_t>(header[0]);
    r.tokens.resize(header[1]);
    if (!in.read(reinterpret_cast<char*>(r.tokens.data()),
                 static_cast<std::streamsize>(header[1] * sizeof(int32_t)))) {
      break;
    }
    *valid_bytes +=
        static_cast<int64_t>(sizeof(header) + header[1] * sizeof(int32_t));
    records.push_back(std::move(r));
  }
  return records;
}

}  // namespace

absl::StatusOr<std::vector<DistillRecord>> ReadDistillData(
    const std::string& path) {
  if (!PathExists(path)) return absl::NotFoundError(absl::StrCat("no ", path));
  int64_t valid = 0;
  return ReadRecords(path, &valid);
}

absl::StatusOr<std::vector<DistillRecord>> ReadDistillFiles(
    const std::string& paths) {
  std::vector<DistillRecord> all;
  for (absl::string_view path : absl::StrSplit(paths, ',')) {
    if (path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty file name in the list \"", paths, "\""));
    }
    ASSIGN_OR_RETURN(std::vector<DistillRecord> records,
                     ReadDistillData(std::string(path)));
    all.insert(all.end(), std::make_move_iterator(records.begin()),
               std::make_move_iterator(records.end()));
  }
  return all;
}

absl::StatusOr<StageOutcome> RunDistill(const DistillOptions& o) {
  const std::string tokenizer_path = o.target_dir + "/tokenizer.json";
  ASSIGN_OR_RETURN(std::string tokenizer_json,
                   ReadFileToString(tokenizer_path));
  ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromJson(tokenizer_json));
  const std::optional<int32_t> eot = tokenizer->TokenToId("<|endoftext|>");
  if (!eot) return absl::InvalidArgumentError("tokenizer has no <|endoftext|>");
  RETURN_IF_ERROR(MakeDirs(o.work_dir));
  ASSIGN_OR_RETURN(std::vector<CorpusFile> files, ListCorpusFiles(o.corpus));
  ASSIGN_OR_RETURN(
      TokenStream train,
      LoadOrBuildTokenStream(files, CorpusSplit::kTrain, *tokenizer,
                             Fnv1a(tokenizer_json), *eot,
                             o.work_dir + "/tokens_train.bin"));
  std::vector<std::vector<int32_t>> task_prompts;
  if (!o.chat_tasks_path.empty()) {
    if (!(o.chat_fraction >= 0 && o.chat_fraction <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat_fraction must be in [0, 1], got ", o.chat_fraction));
    }
    ASSIGN_OR_RETURN(task_prompts,
                     ChatTaskPrompts(o.chat_tasks_path, *tokenizer));
  }
  int64_t valid_bytes = 0;
  ASSIGN_OR_RETURN(std::vector<DistillRecord> done,
                   ReadRecords(o.out_path, &valid_bytes));
  int64_t next = static_cast<int64_t>(done.size());
  if (next >= o.num_sequences) {
    std::cerr << "[distill] " << next << " sequences already in " << o.out_path
              << "\n";
    return StageOutcome::kFinished;
  }
  InProcessStack::Options so;
  so.target_dir = o.target_dir;
  ASSIGN_OR_RETURN(auto stack, InProcessStack::Load(so));

  Deadline deadline(o.max_minutes);
  ProgressLine progress("distill", next, o.num_sequences, 10.0);
  while (next < o.num_sequences && !deadline.Expired()) {
    const int64_t count = std::min<int64_t>(o.batch, o.num_sequences - next);
    std::vector<GenerationRequest> requests;
    std::vector<DistillRecord> records;
    for (int64_t i = next; i < next + count; ++i) {
      std::mt19937_64 rng(o.seed * 0x9e3779b97f4a7c15ull +
                          static_cast<uint64_t>(i));
      GenerationRequest r;
      std::uniform_real_distribution<double> coin(0.0, 1.0);
      if (!task_prompts.empty() && coin(rng) < o.chat_fraction) {
        std::uniform_int_distribution<size_t> pick(0, task_prompts.size() - 1);
        r.prompt = task_prompts[pick(rng)];
      } else {
        std::uniform_int_distribution<int> len_dist(o.prompt_min_tokens,
                                                    o.prompt_max_tokens);
        const int len = len_dist(rng);
        std::uniform_int_distribution<int64_t> off_dist(
            0, static_cast<int64_t>(train.tokens.size()) - len - 1);
        const int64_t off = off_dist(rng);
        r.prompt.assign(train.tokens.begin() + off,
                        train.tokens.begin() + off + len);
      }
      const int len = static_cast<int>(r.prompt.size());
      r.max_new_tokens = o.continuation_tokens;
      r.window = 1;
      r.passes = 0;
      DistillRecord rec;
      rec.prompt_len = len;
      rec.tokens = r.prompt;
      records.push_back(std::move(rec));
      requests.push_back(std::move(r));
    }
    ASSIGN_OR_RETURN(std::vector<GenerationResult> results,
                     stack->engine().Generate(std::move(requests)));
    int64_t generated = 0;
    for (size_t i = 0; i < results.size(); ++i) {
      if (!results[i].status.ok()) return results[i].status;
      records[i].tokens.insert(records[i].tokens.end(),
                               results[i].tokens.begin(),
                               results[i].tokens.end());
      generated += static_cast<int64_t>(results[i].tokens.size());
    }
    RETURN_IF_ERROR(AppendRecords(o.out_path, valid_bytes, records));
    ASSIGN_OR_RETURN(done, ReadRecords(o.out_path, &valid_bytes));
    next = static_cast<int64_t>(done.size());
    progress.Report(next, generated, "");
  }
  if (next < o.num_sequences) {
    std::cerr << "[distill] time budget used; " << next << "/"
              << o.num_sequences << " sequences (run again to continue)\n";
    return StageOutcome::kPaused;
  }
  return StageOutcome::kFinished;
}

}  // namespace dedit::training
