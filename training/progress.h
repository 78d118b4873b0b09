// Run bookkeeping shared by the dedit-train stages: the progress line
// (step, loss, tokens/s, ETA) and a wall-clock budget that lets a long run
// stop cleanly at a checkpoint and resume in a later session. Files (the
// JSON-lines log, checkpoints) go through common/base/file_util.h.
//
//   ProgressLine progress("target", first_step, total_steps);
//   progress.Report(step + 1, tokens, absl::StrFormat("loss %.3f", loss));
//   if (budget.Expired()) { save; return StageOutcome::kPaused; }
#ifndef DEDIT_TRAINING_PROGRESS_H_
#define DEDIT_TRAINING_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"

namespace dedit::training {

// How a stage ended: all steps done, or stopped by its time budget (the
// checkpoint is saved; running the same command again continues).
enum class StageOutcome { kFinished, kPaused };

class ProgressLine {
 public:
  // Prints at most every `interval_s` seconds (and always for the last
  // step) to stderr.
  ProgressLine(std::string stage, int64_t first_step, int64_t total_steps,
               double interval_s = 10.0);

  // `step` = steps completed; `tokens` = tokens processed by this step;
  // `fields` = stage-specific text ("loss 3.41 lr 5.0e-04").
  void Report(int64_t step, int64_t tokens, const std::string& fields);
  double elapsed_s() const;
  double tokens_per_s() const;

 private:
  std::string stage_;
  int64_t first_step_, total_steps_;
  double interval_s_;
  std::chrono::steady_clock::time_point start_, last_print_;
  int64_t tokens_ = 0;
};

// A wall-clock budget; zero or negative minutes = unlimited.
class Deadline {
 public:
  explicit Deadline(double minutes);
  bool Expired() const;

 private:
  bool limited_;
  std::chrono::steady_clock::time_point end_;
};

// Seconds since the first call of a periodic action (checkpoints).
class Every {
 public:
  explicit Every(double seconds);
  // True once per `seconds`.
  bool Due();

 private:
  double seconds_;
  std::chrono::steady_clock::time_point last_;
};

// A stage's step loop: calls `step` (which advances *done by one) until
// *done reaches total_steps or max_minutes have passed (0 = no limit),
// calling `save` every checkpoint_every_s seconds. The first error ends it.
// The caller saves once more after it, whether it finished or paused.
absl::Status RunSteps(const std::string& stage, const int64_t* done,
                      int64_t total_steps, double max_minutes,
                      double checkpoint_every_s,
                      const std::function<absl::Status(ProgressLine*)>& step,
                      const std::function<absl::Status()>& save);

// A resumed run's JSON-lines log: keeps the records of steps up to `step`
// (the loaded checkpoint's; 0 for a run starting afresh) and drops those a
// killed run wrote after its last checkpoint, and a torn last line, so
// that the run's steps are each logged once. A missing file is fine.
absl::Status DropLogRecordsAfter(const std::string& path, int64_t step);

// "1h02m", "3m12s", "45s".
std::string FormatDuration(double seconds);

}  // namespace dedit::training

#endif  // DEDIT_TRAINING_PROGRESS_H_
