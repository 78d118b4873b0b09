#include "training/optimizer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/safetensors.h"
#include "common/base/status.h"
#include "common/model/tensor_io.h"
#include "common/model/torch_status.h"

namespace dedit::training {

AdamW::AdamW(ParameterList* params, AdamWOptions options)
    : params_(params), options_(options) {
  for (const NamedParameter& p : *params_) {
    exp_avg_.push_back(at::zeros_like(p.value.detach()));
    exp_avg_sq_.push_back(at::zeros_like(p.value.detach()));
  }
}

double AdamW::Step(double lr) {
  at::NoGradGuard no_grad;
  double sq = 0;
  for (const NamedParameter& p : *params_) {
    if (p.value.grad().defined()) {
      sq += p.value.grad().pow(2).sum().item<double>();
    }
  }
  const double norm = std::sqrt(sq);
  const double clip = (options_.grad_clip > 0 && norm > options_.grad_clip)
                          ? options_.grad_clip / norm
                          : 1.0;
  ++steps_;
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double bias1 = 1.0 - std::pow(b1, static_cast<double>(steps_));
  const double bias2 = 1.0 - std::pow(b2, static_cast<double>(steps_));
  for (size_t i = 0; i < params_->size(); ++i) {
    at::Tensor& param = (*params_)[i].value;
    if (!param.requires_grad() || !param.grad().defined()) continue;
    at::Tensor g = param.grad() * clip;
    exp_avg_[i].mul_(b1).add_(g, 1.0 - b1);
    exp_avg_sq_[i].mul_(b2).addcmul_(g, g, 1.0 - b2);
    if (options_.weight_decay > 0 && param.dim() >= 2) {
      param.mul_(1.0 - lr * options_.weight_decay);
    }
    at::Tensor denom = (exp_avg_sq_[i] / bias2).sqrt_().add_(options_.eps);
    param.addcdiv_(exp_avg_[i], denom, -lr / bias1);
    param.mutable_grad().zero_();
  }
  return norm;
}

double LearningRate(int64_t step, int64_t total_steps,
                    const LearningRateSchedule& s) {
  const int64_t warmup = std::max<int64_t>(
      1, static_cast<int64_t>(std::llround(s.warmup_fraction * total_steps)));
  if (step < warmup) return s.peak * static_cast<double>(step + 1) / warmup;
  const double span = std::max<int64_t>(1, total_steps - 1 - warmup);
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup) / span);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return s.peak * (s.final_fraction + (1.0 - s.final_fraction) * cosine);
}

absl::Status SaveTrainingState(
    const std::string& path, const ParameterList& params,
    const AdamW& optimizer, int64_t step,
    const std::map<std::string, std::string>& metadata) {
  std::vector<TensorToWrite> tensors;
  auto add = [&](const std::string& name, const at::Tensor& t) -> absl::Status {
    ASSIGN_OR_RETURN(TensorToWrite w,
                     FromTensor(name, t.detach().contiguous()));
    tensors.push_back(std::move(w));
    return absl::OkStatus();
  };
  for (size_t i = 0; i < params.size(); ++i) {
    RETURN_IF_ERROR(add("param/" + params[i].name, params[i].value));
    RETURN_IF_ERROR(add("exp_avg/" + params[i].name, optimizer.exp_avg()[i]));
    RETURN_IF_ERROR(
        add("exp_avg_sq/" + params[i].name, optimizer.exp_avg_sq()[i]));
  }
  std::map<std::string, std::string> meta = metadata;
  meta["step"] = absl::StrCat(step);
  meta["optimizer_steps"] = absl::StrCat(optimizer.steps());
  return WriteSafetensors(path, tensors, meta);
}

absl::StatusOr<int64_t> LoadTrainingState(
    const std::string& path, ParameterList* params, AdamW* optimizer,
    std::map<std::string, std::string>* metadata) {
  ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  const auto& meta = file->metadata();
  int64_t step = 0, optimizer_steps = 0;
  auto step_it = meta.find("step");
  auto opt_it = meta.find("optimizer_steps");
  if (step_it == meta.end() || opt_it == meta.end() ||
      !absl::SimpleAtoi(step_it->second, &step) ||
      !absl::SimpleAtoi(opt_it->second, &optimizer_steps)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": missing step metadata"));
  }
  auto restore = [&](const std::string& name,
                     at::Tensor& into) -> absl::Status {
    const TensorView* view = file->Find(name);
    if (view == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": missing tensor ", name));
    }
    if (view->shape != into.sizes().vec()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", name, " has a different shape"));
    }
    ASSIGN_OR_RETURN(at::Tensor t,
                     ToTensor(*view, into.scalar_type(), into.device()));
    return GuardTorch([&] {
      at::NoGradGuard no_grad;
      into.copy_(t);
    });
  };
  for (size_t i = 0; i < params->size(); ++i) {
    NamedParameter& p = (*params)[i];
    RETURN_IF_ERROR(restore("param/" + p.name, p.value));
    RETURN_IF_ERROR(
        restore("exp_avg/" + p.name, optimizer->mutable_exp_avg()[i]));
    RETURN_IF_ERROR(
        restore("exp_avg_sq/" + p.name, optimizer->mutable_exp_avg_sq()[i]));
  }
  optimizer->set_steps(optimizer_steps);
  if (metadata != nullptr) *metadata = meta;
  return step;
}

}  // namespace dedit::training
