#include "training/progress.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/base/file_util.h"
#include "common/base/status.h"

namespace dedit::training {
namespace {

double SecondsBetween(std::chrono::steady_clock::time_point a,
                      std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

ProgressLine::ProgressLine(std::string stage, int64_t first_step,
                           int64_t total_steps, double interval_s)
    : stage_(std::move(stage)),
      first_step_(first_step),
      total_steps_(total_steps),
      interval_s_(interval_s),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_) {}

double ProgressLine::elapsed_s() const {
  return SecondsBetween(start_, std::chrono::steady_clock::now());
}

double ProgressLine::tokens_per_s() const {
  const double e = elapsed_s();
  return e > 0 ? tokens_ / e : 0;
}

void ProgressLine::Report(int64_t step, int64_t tokens,
                          const std::string& fields) {
  tokens_ += tokens;
  const auto now = std::chrono::steady_clock::now();
  const bool last = step >= total_steps_;
  if (!last && SecondsBetween(last_print_, now) < interval_s_) return;
  last_print_ = now;
  const double elapsed = SecondsBetween(start_, now);
  const int64_t done = step - first_step_;
  const double eta =
      done > 0 ? elapsed / done * static_cast<double>(total_steps_ - step) : 0;
  std::cerr << absl::StrFormat(
      "[%s] step %d/%d %s tok/s %.0f elapsed %s ETA %s\n", stage_, step,
      total_steps_, fields, elapsed > 0 ? tokens_ / elapsed : 0.0,
      FormatDuration(elapsed), FormatDuration(eta));
}

Deadline::Deadline(double minutes)
    : limited_(minutes > 0),
      end_(std::chrono::steady_clock::now() +
           std::chrono::milliseconds(
               static_cast<int64_t>(std::max(0.0, minutes) * 60000.0))) {}

bool Deadline::Expired() const {
  return limited_ && std::chrono::steady_clock::now() >= end_;
}

Every::Every(double seconds)
    : seconds_(seconds), last_(std::chrono::steady_clock::now()) {}

bool Every::Due() {
  const auto now = std::chrono::steady_clock::now();
  if (SecondsBetween(last_, now) < seconds_) return false;
  last_ = now;
  return true;
}

absl::Status RunSteps(const std::string& stage, const int64_t* done,
                      int64_t total_steps, double max_minutes,
                      double checkpoint_every_s,
                      const std::function<absl::Status(ProgressLine*)>& step,
                      const std::function<absl::Status()>& save) {
  Deadline deadline(max_minutes);
  Every checkpoint(checkpoint_every_s);
  ProgressLine progress(stage, *done, total_steps);
  while (*done < total_steps && !deadline.Expired()) {
    RETURN_IF_ERROR(step(&progress));
    if (checkpoint.Due()) RETURN_IF_ERROR(save());
  }
  return absl::OkStatus();
}

std::string FormatDuration(double seconds) {
  if (!(seconds >= 0) || std::isinf(seconds)) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

absl::Status DropLogRecordsAfter(const std::string& path, int64_t step) {
  if (!PathExists(path)) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::string kept;
  size_t dropped = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const nlohmann::json rec =
        nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool keep = rec.is_object() && rec.contains("step") &&
                      rec["step"].is_number_integer() &&
                      rec["step"].get<int64_t>() <= step;
    if (keep) {
      absl::StrAppend(&kept, line, "\n");
    } else {
      ++dropped;
    }
  }
  if (dropped == 0) return absl::OkStatus();
  std::cerr << "[log] " << path << ": dropped " << dropped
            << " records past step " << step << " (logged after the last "
            << "checkpoint)\n";
  return WriteFileAtomically(path, kept);
}

}  // namespace dedit::training
