#include "training/target_trainer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/status.h"
#include "common/model/tensor_io.h"
#include "common/model/torch_status.h"
#include "common/tokenizer/tokenizer.h"
#include "training/trainable_models.h"

namespace dedit::training {
namespace {

// Windows of a token stream: `tokens` [count, seq_len + 1] and `weights`
// [count, seq_len], 1 where the label (the next token) is trained on.
struct Windows {
  at::Tensor tokens;
  at::Tensor weights;
};

// `count` windows of `stream` at offsets drawn from `rng`.
Windows SampleWindows(const TokenStream& stream, int count, int seq_len,
                      std::mt19937_64& rng) {
  const int64_t span = static_cast<int64_t>(stream.tokens.size()) - seq_len - 1;
  std::uniform_int_distribution<int64_t> offset(0, std::max<int64_t>(span, 0));
  std::vector<int64_t> ids;
  std::vector<float> weights;
  ids.reserve(static_cast<size_t>(count) * (seq_len + 1));
  weights.reserve(static_cast<size_t>(count) * seq_len);
  for (int i = 0; i < count; ++i) {
    const int64_t o = offset(rng);
    for (int j = 0; j <= seq_len; ++j) ids.push_back(stream.tokens[o + j]);
    for (int j = 1; j <= seq_len; ++j) {
      weights.push_back(stream.loss_mask.empty() ? 1.0f
                                                 : stream.loss_mask[o + j]);
    }
  }
  return {at::tensor(ids, at::TensorOptions().dtype(at::kLong))
              .view({count, seq_len + 1}),
          at::tensor(weights).view({count, seq_len})};
}

Windows Concat(const Windows& a, const Windows& b) {
  return {at::cat({a.tokens, b.tokens}), at::cat({a.weights, b.weights})};
}

Windows Narrow(const Windows& w, int64_t start, int64_t length) {
  return {w.tokens.narrow(0, start, length),
          w.weights.narrow(0, start, length)};
}

// Mean cross-entropy over the trained labels; also returns their count.
at::Tensor NextTokenLoss(const TrainableTarget& model, const Windows& windows,
                         double* trained_labels = nullptr) {
  const int64_t t = windows.tokens.size(1) - 1;
  at::Tensor inputs = windows.tokens.narrow(1, 0, t);
  at::Tensor labels = windows.tokens.narrow(1, 1, t);
  at::Tensor logits = model.Logits(model.Forward(inputs, {}, nullptr));
  at::Tensor per_token = at::cross_entropy_loss(
      logits.reshape({-1, logits.size(-1)}), labels.reshape({-1}),
      /*weight=*/{}, at::Reduction::None);
  at::Tensor w = windows.weights.reshape({-1});
  at::Tensor total = w.sum();
  if (trained_labels != nullptr) *trained_labels = total.item<double>();
  return (per_token * w).sum() / total.clamp_min(1.0);
}

std::string RunFingerprint(const TargetTrainingOptions& o, const Qwen3Config& c,
                           int64_t steps) {
  std::string fingerprint = absl::StrCat(
      Qwen3ConfigToJson(c), "seq_len=", o.seq_len, " batch=", o.batch_size,
      " steps=", steps, " seed=", o.seed, " lr=", o.schedule.peak);
  if (!o.chat_tasks_dir.empty()) {
    absl::StrAppend(&fingerprint, " chat_fraction=", o.chat_fraction,
                    " chat_loss=answers");
  }
  if (!o.init_from.empty())
    absl::StrAppend(&fingerprint, " init_from=", o.init_from);
  return fingerprint;
}

// Windows per batch drawn from the chat tasks (0 without them).
int ChatWindows(const TargetTrainingOptions& o) {
  return o.chat_tasks_dir.empty()
             ? 0
             : static_cast<int>(std::lround(o.batch_size * o.chat_fraction));
}

// The exported model's config: the shape asked for, with the tokenizer's
// vocabulary, <|endoftext|> (`eot`) as EOS, and <|im_end|> as a second EOS
// when training on chat tasks.
absl::StatusOr<Qwen3Config> BuildModelConfig(const TargetTrainingOptions& o,
                                             const Tokenizer& tokenizer,
                                             int32_t eot) {
  Qwen3Config config = o.model;
  config.vocab_size = tokenizer.vocab_size();
  config.bos_token_id = -1;
  config.eos_token_ids = {eot};
  if (!o.chat_tasks_dir.empty()) {
    if (!(o.chat_fraction > 0 && o.chat_fraction <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat_fraction must be in (0, 1], got ", o.chat_fraction));
    }
    const std::optional<int32_t> im_end = tokenizer.TokenToId("<|im_end|>");
    if (!im_end) {
      return absl::InvalidArgumentError(
          "chat tasks need a tokenizer with <|im_end|>");
    }
    config.eos_token_ids.push_back(*im_end);
  }
  // The context the model is exported for; at least the training window.
  // A longer one (RoPE positions the training never saw at the end of a
  // window) lets prompts + answers that fit in seq_len start later.
  config.max_position_embeddings = std::max(o.seq_len, o.max_positions);
  config.dtype = "float32";
  return config;
}

// The token streams a run samples its windows from.
struct TrainingData {
  TokenStream train, heldout;              // the corpus's splits
  TokenStream tasks_train, tasks_heldout;  // the chat tasks' (may be empty)
};

// Tokenizes the corpus (cached in work_dir, keyed by `tokenizer_json`) and
// the chat tasks; each stream must be longer than one window.
absl::Status LoadTrainingData(const TargetTrainingOptions& o,
                              const Tokenizer& tokenizer,
                              const std::string& tokenizer_json, int32_t eot,
                              TrainingData* data) {
  RETURN_IF_ERROR(MakeDirs(o.work_dir));
  ASSIGN_OR_RETURN(std::vector<CorpusFile> files, ListCorpusFiles(o.corpus));
  const uint64_t tok_hash = Fnv1a(tokenizer_json);
  ASSIGN_OR_RETURN(
      data->train,
      LoadOrBuildTokenStream(files, CorpusSplit::kTrain, tokenizer, tok_hash,
                             eot, o.work_dir + "/tokens_train.bin"));
  ASSIGN_OR_RETURN(
      data->heldout,
      LoadOrBuildTokenStream(files, CorpusSplit::kHeldOut, tokenizer, tok_hash,
                             eot, o.work_dir + "/tokens_heldout.bin"));
  std::cerr << absl::StrFormat(
      "[target] corpus: %d train docs / %d tokens, %d held-out docs / %d "
      "tokens\n",
      data->train.num_documents, data->train.tokens.size(),
      data->heldout.num_documents, data->heldout.tokens.size());
  auto too_short = [&](const TokenStream& s) {
    return static_cast<int64_t>(s.tokens.size()) <= o.seq_len + 1;
  };
  if (too_short(data->train) || too_short(data->heldout)) {
    return absl::FailedPreconditionError("corpus too small for seq_len");
  }
  if (o.chat_tasks_dir.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(
      data->tasks_train,
      TokenizeChatTasks(o.chat_tasks_dir + "/train.jsonl", tokenizer, eot));
  ASSIGN_OR_RETURN(
      data->tasks_heldout,
      TokenizeChatTasks(o.chat_tasks_dir + "/heldout.jsonl", tokenizer, eot));
  std::cerr << absl::StrFormat(
      "[target] chat tasks: %d train / %d tokens, %d held-out / %d tokens; "
      "%d of %d windows per batch\n",
      data->tasks_train.num_documents, data->tasks_train.tokens.size(),
      data->tasks_heldout.num_documents, data->tasks_heldout.tokens.size(),
      ChatWindows(o), o.batch_size);
  if (too_short(data->tasks_train) || too_short(data->tasks_heldout)) {
    return absl::FailedPreconditionError("chat tasks too small for seq_len");
  }
  return absl::OkStatus();
}

// Fresh weights from `config`, or init_from's: of the same shape, or of
// fewer layers, grown to config's (the same function at step 0).
absl::StatusOr<TrainableTarget> InitialModel(const TargetTrainingOptions& o,
                                             const Qwen3Config& config) {
  if (o.init_from.empty()) return TrainableTarget::Init(config, o.seed);
  ASSIGN_OR_RETURN(TrainableTarget model, TrainableTarget::Load(o.init_from));
  const Qwen3Config& f = model.config();
  if (f.vocab_size != config.vocab_size ||
      f.hidden_size != config.hidden_size ||
      f.intermediate_size != config.intermediate_size ||
      f.num_hidden_layers > config.num_hidden_layers ||
      f.num_attention_heads != config.num_attention_heads ||
      f.num_key_value_heads != config.num_key_value_heads ||
      f.head_dim != config.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.init_from, " does not have the shape asked for: ",
                     Qwen3ConfigToJson(f), " vs ", Qwen3ConfigToJson(config)));
  }
  if (f.num_hidden_layers == config.num_hidden_layers) return std::move(model);
  std::cerr << absl::StrFormat("[target] growing %s from %d to %d layers\n",
                               o.init_from, f.num_hidden_layers,
                               config.num_hidden_layers);
  return TrainableTarget::Grow(model, config.num_hidden_layers, o.seed);
}

// The optimisation of one target: the model and its optimizer, the step
// counter, the fixed held-out windows, and the state and log files in
// work_dir. The optimizer points into the model, so a run is not copied.
class TargetRun {
 public:
  TargetRun(const TargetTrainingOptions& o, const Qwen3Config& config,
            const TrainingData& data, TrainableTarget model)
      : o_(o),
        config_(config),
        data_(data),
        chat_windows_(ChatWindows(o)),
        model_(std::move(model)),
        optimizer_(&model_.parameters(), o.adamw),
        state_path_(o.work_dir + "/state.safetensors"),
        log_path_(o.work_dir + "/log.jsonl"),
        fingerprint_(RunFingerprint(o, config, o.steps)) {
    std::mt19937_64 eval_rng(o.seed ^ 0x5eed5eedull);
    eval_windows_ =
        SampleWindows(data.heldout, o.eval_windows, o.seq_len, eval_rng);
    // The held-out task loss is over answer tokens, as trained.
    if (chat_windows_ > 0) {
      task_eval_windows_ = SampleWindows(data.tasks_heldout, o.eval_windows,
                                         o.seq_len, eval_rng);
    }
  }
  TargetRun(const TargetRun&) = delete;
  TargetRun& operator=(const TargetRun&) = delete;

  // Continues from work_dir's state when there is one (of this run, or of
  // the same run on reschedule_from_steps steps), and drops the log records
  // written after it.
  absl::Status Resume();
  // Steps until `steps`, or until max_minutes have passed; checkpoints
  // every checkpoint_every_s seconds.
  absl::Status Train();
  absl::Status Save() const {
    return SaveTrainingState(state_path_, model_.parameters(), optimizer_,
                             step_, {{"fingerprint", fingerprint_}});
  }
  int64_t step() const { return step_; }
  const TrainableTarget& model() const { return model_; }

 private:
  // One optimizer step, logged; held-out losses when an evaluation is due.
  absl::Status TrainStep(ProgressLine* progress);
  // Adds the held-out losses to `record` and prints them.
  void Evaluate(nlohmann::json* record);
  // Mean loss over `windows`' trained labels, in batch_size chunks.
  double HeldoutLoss(const Windows& windows);

  const TargetTrainingOptions& o_;
  const Qwen3Config& config_;
  const TrainingData& data_;
  const int chat_windows_;
  TrainableTarget model_;
  AdamW optimizer_;
  const std::string state_path_, log_path_, fingerprint_;
  int64_t step_ = 0;
  double loss_ema_ = -1;  // of the training loss, for the progress line
  // Held-out windows, the same at every evaluation.
  Windows eval_windows_, task_eval_windows_;
};

absl::Status TargetRun::Resume() {
  if (PathExists(state_path_)) {
    std::map<std::string, std::string> meta;
    ASSIGN_OR_RETURN(step_, LoadTrainingState(state_path_, &model_.parameters(),
                                              &optimizer_, &meta));
    const bool rescheduled =
        o_.reschedule_from_steps > 0 && o_.reschedule_from_steps != o_.steps &&
        meta["fingerprint"] ==
            RunFingerprint(o_, config_, o_.reschedule_from_steps);
    if (rescheduled) {
      if (step_ >= o_.steps) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--steps=", o_.steps, " is not past the saved step ", step_));
      }
      std::cerr << "[target] rescheduled from " << o_.reschedule_from_steps
                << " to " << o_.steps << " steps\n";
    } else if (meta["fingerprint"] != fingerprint_) {
      return absl::FailedPreconditionError(
          absl::StrCat(state_path_,
                       " belongs to a different run (model, batch, steps, seed "
                       "or lr differ); use another --work_dir or delete it"));
    }
    std::cerr << "[target] resumed at step " << step_ << "\n";
  }
  return DropLogRecordsAfter(log_path_, step_);
}

absl::Status TargetRun::Train() {
  return GuardTorch([&] {
    return RunSteps(
        "target", &step_, o_.steps, o_.max_minutes, o_.checkpoint_every_s,
        [this](ProgressLine* progress) { return TrainStep(progress); },
        [this] { return Save(); });
  });
}

absl::Status TargetRun::TrainStep(ProgressLine* progress) {
  // The batch is a function of (seed, step), so that a resumed run goes on
  // as the uninterrupted one would.
  std::mt19937_64 rng(o_.seed * 0x9e3779b97f4a7c15ull + step_);
  Windows windows = SampleWindows(data_.train, o_.batch_size - chat_windows_,
                                  o_.seq_len, rng);
  if (chat_windows_ > 0) {
    windows = Concat(windows, SampleWindows(data_.tasks_train, chat_windows_,
                                            o_.seq_len, rng));
  }
  at::Tensor loss = NextTokenLoss(model_, windows);
  loss.backward();
  const double lr = LearningRate(step_, o_.steps, o_.schedule);
  const double grad_norm = optimizer_.Step(lr);
  const double l = loss.item<double>();
  loss_ema_ = loss_ema_ < 0 ? l : 0.95 * loss_ema_ + 0.05 * l;
  ++step_;
  nlohmann::json rec = {
      {"step", step_}, {"loss", l}, {"lr", lr}, {"grad_norm", grad_norm}};
  if (step_ % o_.eval_every == 0 || step_ == o_.steps) Evaluate(&rec);
  RETURN_IF_ERROR(AppendToFile(log_path_, rec.dump() + "\n"));
  progress->Report(step_, int64_t{o_.batch_size} * o_.seq_len,
                   absl::StrFormat("loss %.4f (ema %.4f) lr %.2e gnorm %.2f", l,
                                   loss_ema_, lr, grad_norm));
  return absl::OkStatus();
}

void TargetRun::Evaluate(nlohmann::json* record) {
  nlohmann::json& rec = *record;
  rec["heldout_loss"] = HeldoutLoss(eval_windows_);
  std::cerr << absl::StrFormat("[target] step %d held-out loss %.4f\n", step_,
                               rec["heldout_loss"].get<double>());
  if (chat_windows_ > 0) {
    rec["heldout_task_loss"] = HeldoutLoss(task_eval_windows_);
    std::cerr << absl::StrFormat(
        "[target] step %d held-out chat task loss %.4f\n", step_,
        rec["heldout_task_loss"].get<double>());
  }
}

double TargetRun::HeldoutLoss(const Windows& windows) {
  at::NoGradGuard no_grad;
  double sum = 0, n = 0;
  const int chunk = std::max(1, o_.batch_size);
  for (int64_t i = 0; i < windows.tokens.size(0); i += chunk) {
    const int64_t m = std::min<int64_t>(chunk, windows.tokens.size(0) - i);
    double labels = 0;
    sum +=
        NextTokenLoss(model_, Narrow(windows, i, m), &labels).item<double>() *
        labels;
    n += labels;
  }
  return sum / std::max(n, 1.0);
}

}  // namespace

absl::StatusOr<StageOutcome> RunTargetTraining(const TargetTrainingOptions& o) {
  ASSIGN_OR_RETURN(std::string tokenizer_json,
                   ReadFileToString(o.tokenizer_path));
  ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromJson(tokenizer_json));
  const std::optional<int32_t> eot = tokenizer->TokenToId("<|endoftext|>");
  if (!eot) {
    return absl::InvalidArgumentError("tokenizer has no <|endoftext|> token");
  }
  ASSIGN_OR_RETURN(const Qwen3Config config,
                   BuildModelConfig(o, *tokenizer, *eot));
  TrainingData data;
  RETURN_IF_ERROR(LoadTrainingData(o, *tokenizer, tokenizer_json, *eot, &data));
  ASSIGN_OR_RETURN(TrainableTarget model, InitialModel(o, config));

  TargetRun run(o, config, data, std::move(model));
  RETURN_IF_ERROR(run.Resume());
  RETURN_IF_ERROR(run.Train());
  RETURN_IF_ERROR(run.Save());
  if (run.step() < o.steps) {
    std::cerr << "[target] time budget used; paused at step " << run.step()
              << " (run the same command again to continue)\n";
    return StageOutcome::kPaused;
  }
  ASSIGN_OR_RETURN(at::ScalarType dtype, ParseScalarType(o.export_dtype));
  RETURN_IF_ERROR(run.model().Export(o.out_dir, dtype,
                                     {{"tokenizer.json", tokenizer_json}}));
  std::cerr << "[target] exported " << o.out_dir << "\n";
  return StageOutcome::kFinished;
}

}  // namespace dedit::training
