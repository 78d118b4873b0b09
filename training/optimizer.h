// AdamW with decoupled weight decay, global-norm gradient clipping and a
// warmup + cosine learning-rate schedule, plus the resumable training state
// (parameters, optimizer moments, step) in one safetensors file.
//
// The schedule is a pure function of the step, and the trainers draw each
// step's batch from (seed, step), so a run resumed from a checkpoint
// continues exactly as the uninterrupted run would have.
//
//   AdamW opt(&model.parameters(), AdamWOptions{});
//   loss.backward();
//   double grad_norm = opt.Step(LearningRate(step, total, schedule));
//   RETURN_IF_ERROR(SaveTrainingState(path, model.parameters(), opt, step + 1,
//                                     {{"config", json}}));
#ifndef DEDIT_TRAINING_OPTIMIZER_H_
#define DEDIT_TRAINING_OPTIMIZER_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "training/trainable_models.h"

namespace dedit::training {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  // Applied to matrices only (norm weights are not decayed).
  double weight_decay = 0.1;
  // Global L2 norm the gradients are clipped to; <= 0 disables clipping.
  double grad_clip = 1.0;
};

class AdamW {
 public:
  // `params` must outlive the optimizer; only tensors with requires_grad
  // are updated.
  AdamW(ParameterList* params, AdamWOptions options);

  // One update from the parameters' .grad() at learning rate `lr`; the
  // gradients are zeroed afterwards. Returns the gradient norm before
  // clipping.
  double Step(double lr);

  int64_t steps() const { return steps_; }
  // First/second moments, parallel to the parameter list.
  const std::vector<at::Tensor>& exp_avg() const { return exp_avg_; }
  const std::vector<at::Tensor>& exp_avg_sq() const { return exp_avg_sq_; }
  std::vector<at::Tensor>& mutable_exp_avg() { return exp_avg_; }
  std::vector<at::Tensor>& mutable_exp_avg_sq() { return exp_avg_sq_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  ParameterList* params_;
  AdamWOptions options_;
  int64_t steps_ = 0;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
};

struct LearningRateSchedule {
  double peak = 6e-4;
  double warmup_fraction = 0.04;  // DFlash's warmup ratio
  double final_fraction = 0.1;    // lr at the last step = peak * this
};

// Linear warmup to `peak` over warmup_fraction * total steps, then cosine
// decay to peak * final_fraction at step total - 1.
double LearningRate(int64_t step, int64_t total_steps,
                    const LearningRateSchedule& schedule);

// Writes parameters, moments and `step` (the number of completed steps)
// atomically to `path`. `metadata` is stored alongside (e.g. the model
// config, to refuse resuming a different model).
absl::Status SaveTrainingState(
    const std::string& path, const ParameterList& params,
    const AdamW& optimizer, int64_t step,
    const std::map<std::string, std::string>& metadata);

// Restores what SaveTrainingState wrote into existing parameters and
// optimizer; returns the step. INVALID_ARGUMENT when names or shapes differ;
// `metadata` (may be null) receives the stored metadata.
absl::StatusOr<int64_t> LoadTrainingState(
    const std::string& path, ParameterList* params, AdamW* optimizer,
    std::map<std::string, std::string>* metadata);

}  // namespace dedit::training

#endif  // DEDIT_TRAINING_OPTIMIZER_H_
