#include "training/target_trainer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"
#include "base/status.h"
#include "model/tensor_io.h"
#include "model/torch_status.h"
#include "tokenizer/tokenizer.h"
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

}  // namespace

absl::StatusOr<StageOutcome> RunTargetTraining(const TargetTrainingOptions& o) {
  ASSIGN_OR_RETURN(std::string tokenizer_json,
                   ReadFileToString(o.tokenizer_path));
  ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromJson(tokenizer_json));
  const std::optional<int32_t> eot = tokenizer->TokenToId("<|endoftext|>");
  if (!eot) {
    return absl::InvalidArgumentError("tokenizer has no <|endoftext|> token");
  }
  Qwen3Config config = o.model;
  config.vocab_size = tokenizer->vocab_size();
  config.bos_token_id = -1;
  config.eos_token_ids = {*eot};
  const int chat_windows =
      o.chat_tasks_dir.empty()
          ? 0
          : static_cast<int>(std::lround(o.batch_size * o.chat_fraction));
  if (!o.chat_tasks_dir.empty()) {
    if (!(o.chat_fraction > 0 && o.chat_fraction <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat_fraction must be in (0, 1], got ", o.chat_fraction));
    }
    const std::optional<int32_t> im_end = tokenizer->TokenToId("<|im_end|>");
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

  RETURN_IF_ERROR(MakeDirs(o.work_dir));
  ASSIGN_OR_RETURN(std::vector<CorpusFile> files, ListCorpusFiles(o.corpus));
  const uint64_t tok_hash = Fnv1a(tokenizer_json);
  ASSIGN_OR_RETURN(
      TokenStream train,
      LoadOrBuildTokenStream(files, CorpusSplit::kTrain, *tokenizer, tok_hash,
                             *eot, o.work_dir + "/tokens_train.bin"));
  ASSIGN_OR_RETURN(
      TokenStream heldout,
      LoadOrBuildTokenStream(files, CorpusSplit::kHeldOut, *tokenizer, tok_hash,
                             *eot, o.work_dir + "/tokens_heldout.bin"));
  std::cerr << absl::StrFormat(
      "[target] corpus: %d train docs / %d tokens, %d held-out docs / %d "
      "tokens\n",
      train.num_documents, train.tokens.size(), heldout.num_documents,
      heldout.tokens.size());
  if (static_cast<int64_t>(train.tokens.size()) <= o.seq_len + 1 ||
      static_cast<int64_t>(heldout.tokens.size()) <= o.seq_len + 1) {
    return absl::FailedPreconditionError("corpus too small for seq_len");
  }
  TokenStream tasks_train, tasks_heldout;
  if (!o.chat_tasks_dir.empty()) {
    ASSIGN_OR_RETURN(
        tasks_train,
        TokenizeChatTasks(o.chat_tasks_dir + "/train.jsonl", *tokenizer, *eot));
    ASSIGN_OR_RETURN(tasks_heldout,
                     TokenizeChatTasks(o.chat_tasks_dir + "/heldout.jsonl",
                                       *tokenizer, *eot));
    std::cerr << absl::StrFormat(
        "[target] chat tasks: %d train / %d tokens, %d held-out / %d tokens; "
        "%d of %d windows per batch\n",
        tasks_train.num_documents, tasks_train.tokens.size(),
        tasks_heldout.num_documents, tasks_heldout.tokens.size(), chat_windows,
        o.batch_size);
    if (static_cast<int64_t>(tasks_train.tokens.size()) <= o.seq_len + 1 ||
        static_cast<int64_t>(tasks_heldout.tokens.size()) <= o.seq_len + 1) {
      return absl::FailedPreconditionError("chat tasks too small for seq_len");
    }
  }

  TrainableTarget model;
  if (o.init_from.empty()) {
    ASSIGN_OR_RETURN(model, TrainableTarget::Init(config, o.seed));
  } else {
    ASSIGN_OR_RETURN(model, TrainableTarget::Load(o.init_from));
    const Qwen3Config& f = model.config();
    // The same shape, or fewer layers (grown below).
    if (f.vocab_size != config.vocab_size ||
        f.hidden_size != config.hidden_size ||
        f.intermediate_size != config.intermediate_size ||
        f.num_hidden_layers > config.num_hidden_layers ||
        f.num_attention_heads != config.num_attention_heads ||
        f.num_key_value_heads != config.num_key_value_heads ||
        f.head_dim != config.head_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          o.init_from, " does not have the shape asked for: ",
          Qwen3ConfigToJson(f), " vs ", Qwen3ConfigToJson(config)));
    }
    if (f.num_hidden_layers < config.num_hidden_layers) {
      // A deeper target from a shallower one: same function at step 0.
      std::cerr << absl::StrFormat("[target] growing %s from %d to %d layers\n",
                                   o.init_from, f.num_hidden_layers,
                                   config.num_hidden_layers);
      ASSIGN_OR_RETURN(model, TrainableTarget::Grow(
                                  model, config.num_hidden_layers, o.seed));
    }
  }
  AdamW optimizer(&model.parameters(), o.adamw);
  const std::string state_path = o.work_dir + "/state.safetensors";
  const std::string log_path = o.work_dir + "/log.jsonl";
  const std::string fingerprint = RunFingerprint(o, config, o.steps);
  int64_t step = 0;
  if (PathExists(state_path)) {
    std::map<std::string, std::string> meta;
    ASSIGN_OR_RETURN(step, LoadTrainingState(state_path, &model.parameters(),
                                             &optimizer, &meta));
    const bool rescheduled =
        o.reschedule_from_steps > 0 && o.reschedule_from_steps != o.steps &&
        meta["fingerprint"] ==
            RunFingerprint(o, config, o.reschedule_from_steps);
    if (rescheduled) {
      if (step >= o.steps) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--steps=", o.steps, " is not past the saved step ", step));
      }
      std::cerr << "[target] rescheduled from " << o.reschedule_from_steps
                << " to " << o.steps << " steps\n";
    } else if (meta["fingerprint"] != fingerprint) {
      return absl::FailedPreconditionError(
          absl::StrCat(state_path,
                       " belongs to a different run (model, batch, steps, seed "
                       "or lr differ); use another --work_dir or delete it"));
    }
    std::cerr << "[target] resumed at step " << step << "\n";
  }
  RETURN_IF_ERROR(DropLogRecordsAfter(log_path, step));

  // Fixed held-out windows, the same at every evaluation.
  std::mt19937_64 eval_rng(o.seed ^ 0x5eed5eedull);
  const Windows eval_windows =
      SampleWindows(heldout, o.eval_windows, o.seq_len, eval_rng);
  // The held-out task loss is over answer tokens, as trained.
  const Windows task_eval_windows =
      chat_windows > 0
          ? SampleWindows(tasks_heldout, o.eval_windows, o.seq_len, eval_rng)
          : Windows();
  auto heldout_loss = [&](const Windows& eval_windows) {
    at::NoGradGuard no_grad;
    double sum = 0, n = 0;
    const int chunk = std::max(1, o.batch_size);
    for (int64_t i = 0; i < eval_windows.tokens.size(0); i += chunk) {
      const int64_t m =
          std::min<int64_t>(chunk, eval_windows.tokens.size(0) - i);
      double labels = 0;
      sum += NextTokenLoss(model, Narrow(eval_windows, i, m), &labels)
                 .item<double>() *
             labels;
      n += labels;
    }
    return sum / std::max(n, 1.0);
  };
  auto save = [&]() {
    return SaveTrainingState(state_path, model.parameters(), optimizer, step,
                             {{"fingerprint", fingerprint}});
  };

  Deadline deadline(o.max_minutes);
  Every checkpoint(o.checkpoint_every_s);
  ProgressLine progress("target", step, o.steps);
  double loss_ema = -1;
  RETURN_IF_ERROR(GuardTorch([&]() -> absl::Status {
    while (step < o.steps) {
      if (deadline.Expired()) break;
      std::mt19937_64 rng(o.seed * 0x9e3779b97f4a7c15ull + step);
      Windows windows =
          SampleWindows(train, o.batch_size - chat_windows, o.seq_len, rng);
      if (chat_windows > 0) {
        windows = Concat(
            windows, SampleWindows(tasks_train, chat_windows, o.seq_len, rng));
      }
      at::Tensor loss = NextTokenLoss(model, windows);
      loss.backward();
      const double lr = LearningRate(step, o.steps, o.schedule);
      const double grad_norm = optimizer.Step(lr);
      const double l = loss.item<double>();
      loss_ema = loss_ema < 0 ? l : 0.95 * loss_ema + 0.05 * l;
      ++step;
      nlohmann::json rec = {
          {"step", step}, {"loss", l}, {"lr", lr}, {"grad_norm", grad_norm}};
      if (step % o.eval_every == 0 || step == o.steps) {
        rec["heldout_loss"] = heldout_loss(eval_windows);
        std::cerr << absl::StrFormat("[target] step %d held-out loss %.4f\n",
                                     step, rec["heldout_loss"].get<double>());
        if (chat_windows > 0) {
          rec["heldout_task_loss"] = heldout_loss(task_eval_windows);
          std::cerr << absl::StrFormat(
              "[target] step %d held-out chat task loss %.4f\n", step,
              rec["heldout_task_loss"].get<double>());
        }
      }
      RETURN_IF_ERROR(AppendToFile(log_path, rec.dump() + "\n"));
      progress.Report(step, int64_t{o.batch_size} * o.seq_len,
                      absl::StrFormat("loss %.4f (ema %.4f) lr %.2e gnorm %.2f",
                                      l, loss_ema, lr, grad_norm));
      if (checkpoint.Due()) RETURN_IF_ERROR(save());
    }
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(save());
  if (step < o.steps) {
    std::cerr << "[target] time budget used; paused at step " << step
              << " (run the same command again to continue)\n";
    return StageOutcome::kPaused;
  }
  ASSIGN_OR_RETURN(at::ScalarType dtype, ParseScalarType(o.export_dtype));
  RETURN_IF_ERROR(
      model.Export(o.out_dir, dtype, {{"tokenizer.json", tokenizer_json}}));
  std::cerr << "[target] exported " << o.out_dir << "\n";
  return StageOutcome::kFinished;
}

}  // namespace dedit::training
