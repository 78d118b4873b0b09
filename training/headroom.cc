#include "training/headroom.h"

#include <iostream>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/base/file_util.h"
#include "common/base/status.h"
#include "common/tokenizer/tokenizer.h"
#include "training/corpus.h"
#include "training/distill.h"
#include "training/drafter_trainer.h"

namespace dedit::training {
namespace {

// A distinct answer and the family of the instance it answers.
struct Answer {
  const DistillRecord* record = nullptr;
  std::string family;
};

// What the assignment of records to instances found.
struct Assignment {
  std::vector<Answer> answers;
  int64_t records = 0, repeats = 0, repeats_differing = 0;
};

// The "family" of each instance of a chat task jsonl, in the order of
// ChatTaskPrompts (its non-empty lines).
absl::StatusOr<std::vector<std::string>> TaskFamilies(const std::string& path) {
  ASSIGN_OR_RETURN(std::string content, ReadFileToString(path));
  std::vector<std::string> families;
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    if (line.empty()) continue;
    const nlohmann::json j =
        nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    families.push_back(j.is_object() && j.contains("family") &&
                               j["family"].is_string()
                           ? j["family"].get<std::string>()
                           : "unknown");
  }
  return families;
}

// Each record to the instance whose tokenized prompt is its prompt; the
// first record of an instance counts, a repeat is tallied (and whether its
// answer differs). FAILED_PRECONDITION when a record matches no instance.
absl::StatusOr<Assignment> AssignToTasks(
    const std::vector<DistillRecord>& records, const std::string& tasks_path,
    const std::string& target_dir) {
  ASSIGN_OR_RETURN(auto tokenizer,
                   Tokenizer::FromFile(target_dir + "/tokenizer.json"));
  ASSIGN_OR_RETURN(const auto prompts, ChatTaskPrompts(tasks_path, *tokenizer));
  ASSIGN_OR_RETURN(const auto families, TaskFamilies(tasks_path));
  if (prompts.size() != families.size()) {
    return absl::InternalError(absl::StrCat(tasks_path, ": ", prompts.size(),
                                            " prompts, ", families.size(),
                                            " families"));
  }
  std::map<std::vector<int32_t>, size_t> by_prompt;
  for (size_t i = 0; i < prompts.size(); ++i) by_prompt.emplace(prompts[i], i);
  Assignment out;
  std::map<size_t, const DistillRecord*> first;
  for (size_t r = 0; r < records.size(); ++r) {
    const DistillRecord& rec = records[r];
    const std::vector<int32_t> prompt(rec.tokens.begin(),
                                      rec.tokens.begin() + rec.prompt_len);
    const auto it = by_prompt.find(prompt);
    if (it == by_prompt.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "record ", r, "'s prompt is no instance of ", tasks_path,
          " (generate the task file the data was distilled from)"));
    }
    ++out.records;
    const auto [seen, fresh] = first.emplace(it->second, &rec);
    if (fresh) {
      out.answers.push_back({&rec, families[it->second]});
    } else {
      ++out.repeats;
      if (seen->second->tokens != rec.tokens) ++out.repeats_differing;
    }
  }
  return out;
}

// Every distinct record, in one family "all".
Assignment AllRecords(const std::vector<DistillRecord>& records) {
  Assignment out;
  std::map<std::vector<int32_t>, bool> seen;
  for (const DistillRecord& rec : records) {
    ++out.records;
    if (seen.emplace(rec.tokens, true).second) {
      out.answers.push_back({&rec, "all"});
    } else {
      ++out.repeats;
    }
  }
  return out;
}

// Per-slot rates (sums / counts) and their means.
void AddMeasure(const std::string& name, const std::vector<double>& sums,
                const std::vector<double>& n, nlohmann::json* summary) {
  std::vector<double> rates;
  double mean = 0, slots = 0, total = 0, count = 0;
  for (size_t k = 0; k < sums.size(); ++k) {
    rates.push_back(n[k] > 0 ? sums[k] / n[k] : 0.0);
    if (n[k] > 0) {
      mean += rates.back();
      ++slots;
    }
    total += sums[k];
    count += n[k];
  }
  (*summary)["per_slot"][name] = rates;
  (*summary)["mean_over_slots"][name] = slots > 0 ? mean / slots : 0.0;
  (*summary)["pooled"][name] = count > 0 ? total / count : 0.0;
}

nlohmann::json Summary(const SlotHeadroom& t, int64_t instances) {
  nlohmann::json s;
  s["instances"] = instances;
  double slots = 0;
  for (double v : t.n) slots += v;
  s["slots"] = slots;
  s["per_slot"]["n"] = t.n;
  AddMeasure("p1", t.p1, t.n, &s);
  AddMeasure("p2", t.p2, t.n, &s);
  AddMeasure("left_oracle", t.left_oracle, t.n, &s);
  AddMeasure("full_oracle", t.full_oracle, t.n, &s);
  AddMeasure("p1_block_share", t.p1_block_share, t.n, &s);
  AddMeasure("p2_block_share", t.p2_block_share, t.n, &s);
  AddMeasure("uniform_block_share", t.uniform_block_share, t.n, &s);
  return s;
}

void PrintSummary(const std::string& name, const nlohmann::json& s) {
  const nlohmann::json& m = s["mean_over_slots"];
  std::cerr << absl::StrFormat(
      "[headroom] %-9s n=%3d slots=%6.0f  P1 %.3f  P2 %.3f  left %.3f  "
      "full %.3f  | P2 block share %.3f (uniform %.3f)\n",
      name, s["instances"].get<int>(), s["slots"].get<double>(),
      m["p1"].get<double>(), m["p2"].get<double>(),
      m["left_oracle"].get<double>(), m["full_oracle"].get<double>(),
      m["p2_block_share"].get<double>(),
      m["uniform_block_share"].get<double>());
}

}  // namespace

absl::StatusOr<nlohmann::json> RunHeadroom(const HeadroomOptions& o) {
  ASSIGN_OR_RETURN(const std::vector<DistillRecord> records,
                   ReadDistillData(o.data_path));
  Assignment a;
  if (o.tasks_path.empty()) {
    a = AllRecords(records);
  } else {
    ASSIGN_OR_RETURN(a, AssignToTasks(records, o.tasks_path, o.target_dir));
  }
  if (o.max_instances > 0 &&
      a.answers.size() > static_cast<size_t>(o.max_instances)) {
    a.answers.resize(static_cast<size_t>(o.max_instances));
  }
  std::vector<const DistillRecord*> scored;
  for (const Answer& answer : a.answers) scored.push_back(answer.record);
  ASSIGN_OR_RETURN(const std::vector<SlotHeadroom> tallies,
                   MeasureHeadroom(o.target_dir, o.drafter_dir, scored,
                                   o.window, o.anchor_stride));
  std::map<std::string, std::pair<SlotHeadroom, int64_t>> by_family;
  SlotHeadroom all(o.window - 1);
  for (size_t i = 0; i < tallies.size(); ++i) {
    auto& [tally, count] = by_family[a.answers[i].family];
    tally.Add(tallies[i]);
    ++count;
    all.Add(tallies[i]);
  }
  nlohmann::json report = {{"drafter", o.drafter_dir},
                           {"target", o.target_dir},
                           {"data", o.data_path},
                           {"tasks", o.tasks_path},
                           {"window", o.window},
                           {"anchor_stride", o.anchor_stride},
                           {"records", a.records},
                           {"repeated_records", a.repeats},
                           {"repeats_differing", a.repeats_differing}};
  for (const auto& [family, tally_count] : by_family) {
    report["families"][family] = Summary(tally_count.first, tally_count.second);
    PrintSummary(family, report["families"][family]);
  }
  report["all"] = Summary(all, static_cast<int64_t>(tallies.size()));
  PrintSummary("all", report["all"]);
  return report;
}

}  // namespace dedit::training
