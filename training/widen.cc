#include "training/widen.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <filesystem>
#include <limits>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/bounded_json.h"
#include "common/base/checkpoint_layout.h"
#include "common/base/file_util.h"
#include "common/base/model_config.h"
#include "common/base/safetensors.h"
#include "common/base/status.h"
#include "common/model/tensor_io.h"
#include "common/model/torch_status.h"
#include "nlohmann/json.hpp"

namespace dedit::training {
namespace {

using Json = nlohmann::json;

constexpr char kTargetArchitecture[] = "Qwen3ForCausalLM";
constexpr char kDrafterArchitecture[] = "DFlashDraftModel";
// config.json is a few KB (common/base/model_config.cc reads at most 16 MiB).
constexpr uint64_t kMaxConfigBytes = 16u << 20;
// Tokenizer and generation files a model folder may carry; copied as they
// are (the width is not in them).
constexpr const char* kCarriedFiles[] = {"tokenizer.json",
                                         "tokenizer_config.json",
                                         "special_tokens_map.json",
                                         "generation_config.json",
                                         "vocab.json",
                                         "merges.txt"};

bool IsPowerOfTwo(int f) { return f > 0 && (f & (f - 1)) == 0; }

// How one tensor of the layout widens (widen.h has the algebra).
enum class WideningRule {
  kTileColumns,     // embedding, lm_head: [E, ..., E] along hidden
  kTile,            // residual RMSNorm weight: [g, ..., g]
  kTileScaled,      // final norm before the head: [g, ..., g] / F
  kKeep,            // q_norm, k_norm: per head_dim
  kTileBothScaled,  // decoder-layer product: W.repeat(F, F) / F
  kFeatureColumns,  // drafter fc over n concatenated features
};

// The rule of each tensor name of the (unwidened) layout.
absl::StatusOr<WideningRule> RuleOf(const CheckpointTensor& t,
                                    CheckpointKind kind,
                                    const std::set<std::string>& head_norms) {
  switch (t.role) {
    case TensorRole::kEmbedding:
    case TensorRole::kLmHead:
      return WideningRule::kTileColumns;
    case TensorRole::kNorm:
      if (head_norms.count(t.name)) return WideningRule::kKeep;
      if ((kind == CheckpointKind::kTarget && t.name == kTargetNormWeight) ||
          (kind == CheckpointKind::kDrafter && t.name == kDrafterNormWeight)) {
        return WideningRule::kTileScaled;
      }
      return WideningRule::kTile;
    case TensorRole::kProjection:
    case TensorRole::kResidualOutput:
      if (kind == CheckpointKind::kDrafter && t.name == kDrafterFcWeight) {
        return WideningRule::kFeatureColumns;
      }
      return WideningRule::kTileBothScaled;
  }
  return absl::InternalError(absl::StrCat("no widening rule for ", t.name));
}

// `w` (fp32) widened by `f` under `rule`; `features` is the number of
// concatenated features fc reads.
at::Tensor Widen(const at::Tensor& w, WideningRule rule, int64_t f,
                 int64_t features) {
  const double scale = 1.0 / static_cast<double>(f);
  switch (rule) {
    case WideningRule::kTileColumns:
      return w.repeat({1, f});
    case WideningRule::kTile:
      return w.repeat({f});
    case WideningRule::kTileScaled:
      return w.repeat({f}) * scale;
    case WideningRule::kKeep:
      return w.clone();
    case WideningRule::kTileBothScaled:
      return w.repeat({f, f}) * scale;
    case WideningRule::kFeatureColumns: {
      // [H, n * H] -> [F * H, n * F * H]: feature k's columns copied F
      // times (its F copies), rows copied F times.
      const int64_t h = w.size(0);
      const int64_t in = w.size(1) / features;
      return w.reshape({h, features, 1, in})
                 .expand({h, features, f, in})
                 .reshape({h, features * f * in})
                 .repeat({f, 1}) *
             scale;
    }
  }
  return at::Tensor();
}

// The dtype a weight is written back in: its own.
absl::StatusOr<at::ScalarType> WeightScalarType(const std::string& name,
                                                DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return at::kFloat;
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kF16:
      return at::kHalf;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' has dtype ", DTypeName(dtype),
                       "; model weights must be F32, BF16 or F16"));
  }
}

absl::StatusOr<int> Widened(int value, int factor, const char* what) {
  const int64_t wide = int64_t{value} * factor;
  if (wide > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", value, " x ", factor, " overflows"));
  }
  return static_cast<int>(wide);
}

// The source config.json with its widths multiplied by `f`; every other
// field (dedit_config, dflash_config, eos ids, ...) as it was.
absl::StatusOr<Json> WidenConfigJson(Json j, const Qwen3Config& c, int f) {
  ASSIGN_OR_RETURN(j["hidden_size"], Widened(c.hidden_size, f, "hidden_size"));
  ASSIGN_OR_RETURN(j["intermediate_size"],
                   Widened(c.intermediate_size, f, "intermediate_size"));
  ASSIGN_OR_RETURN(j["num_attention_heads"],
                   Widened(c.num_attention_heads, f, "num_attention_heads"));
  ASSIGN_OR_RETURN(j["num_key_value_heads"],
                   Widened(c.num_key_value_heads, f, "num_key_value_heads"));
  j["head_dim"] = c.head_dim;  // explicit: hidden / heads may have set it
  return j;
}

// Source and destination are distinct folders (a widening in place would
// overwrite the weights it reads through a mapping).
absl::Status CheckFolders(const WidenOptions& o) {
  if (o.from_dir.empty() || o.out_dir.empty()) {
    return absl::InvalidArgumentError("widen needs a source and an out folder");
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(o.from_dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("no model folder at '", o.from_dir, "'"));
  }
  if (std::filesystem::exists(o.out_dir, ec) &&
      std::filesystem::equivalent(o.from_dir, o.out_dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("out folder '", o.out_dir,
                     "' is the source folder; widen into another"));
  }
  if (PathExists(o.out_dir + "/model.safetensors.index.json")) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", o.out_dir,
                     "' holds a sharded checkpoint, which would shadow the "
                     "widened model.safetensors; widen into a fresh folder"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointKind> CheckpointKindOf(
    const std::string& config_json) {
  ASSIGN_OR_RETURN(Json j, ParseBoundedJson(config_json, "config.json"));
  std::vector<std::string> names;
  auto it = j.is_object() ? j.find("architectures") : j.end();
  if (it != j.end() && it->is_array()) {
    for (const Json& a : *it) {
      if (!a.is_string()) continue;
      names.push_back(a.get<std::string>());
      if (names.back() == kTargetArchitecture) return CheckpointKind::kTarget;
      if (names.back() == kDrafterArchitecture) return CheckpointKind::kDrafter;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "config.json: architectures [", absl::StrJoin(names, ", "),
      "] name neither ", kTargetArchitecture, " (a target) nor ",
      kDrafterArchitecture, " (a drafter); only those can be widened"));
}

absl::StatusOr<WidenSummary> WidenCheckpoint(const WidenOptions& o) {
  const int f = o.factor;
  if (f < 1 || f > kMaxWidenFactor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "widening factor ", f, " outside [1, ", kMaxWidenFactor, "]"));
  }
  RETURN_IF_ERROR(CheckFolders(o));
  ASSIGN_OR_RETURN(
      const std::string config_text,
      ReadFileToString(o.from_dir + "/config.json", kMaxConfigBytes));
  absl::StatusOr<CheckpointKind> kind = CheckpointKindOf(config_text);
  if (!kind.ok()) return Annotate(kind.status(), o.from_dir);
  ASSIGN_OR_RETURN(auto archive, WeightArchive::OpenDirectory(o.from_dir));

  // The source's layout and the widened one, tensor for tensor (the layout
  // tables list the same names in the same order for both shapes).
  WidenSummary summary;
  summary.kind = *kind;
  summary.factor = f;
  summary.exact = IsPowerOfTwo(f);
  std::vector<CheckpointTensor> layout, wide_layout;
  std::set<std::string> head_norms;
  Qwen3Config layers;
  int64_t features = 1;
  std::string wide_text;
  ASSIGN_OR_RETURN(Json source_json,
                   ParseBoundedJson(config_text, "config.json"));
  if (*kind == CheckpointKind::kTarget) {
    ASSIGN_OR_RETURN(const Qwen3Config c, ParseQwen3Config(config_text));
    if (!c.tie_word_embeddings && !archive->Contains(kLmHeadWeight)) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.from_dir, ": ", kLmHeadWeight,
                       " missing and tie_word_embeddings is false"));
    }
    layers = c;
    layout = TargetCheckpointLayout(c, *archive);
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const DecoderLayerTensorNames names = TargetLayerTensorNames(l);
      head_norms.insert({names.q_norm, names.k_norm});
    }
    ASSIGN_OR_RETURN(const Json wide_json, WidenConfigJson(source_json, c, f));
    wide_text = wide_json.dump(2) + "\n";
    ASSIGN_OR_RETURN(const Qwen3Config wide, ParseQwen3Config(wide_text));
    wide_layout = TargetCheckpointLayout(wide, *archive);
  } else {
    ASSIGN_OR_RETURN(const DrafterConfig d, ParseDrafterConfig(config_text));
    layers = d.layers;
    features = static_cast<int64_t>(d.target_layer_ids.size());
    layout = DrafterCheckpointLayout(d);
    for (int l = 0; l < d.layers.num_hidden_layers; ++l) {
      const DecoderLayerTensorNames names = DrafterLayerTensorNames(l);
      head_norms.insert({names.q_norm, names.k_norm});
    }
    ASSIGN_OR_RETURN(const Json wide_json,
                     WidenConfigJson(source_json, d.layers, f));
    wide_text = wide_json.dump(2) + "\n";
    ASSIGN_OR_RETURN(const DrafterConfig wide, ParseDrafterConfig(wide_text));
    wide_layout = DrafterCheckpointLayout(wide);
  }
  {
    const absl::Status layout_ok = CheckCheckpointLayout(*archive, layout);
    if (!layout_ok.ok()) return Annotate(layout_ok, o.from_dir);
  }
  if (wide_layout.size() != layout.size()) {
    return absl::InternalError("widened layout lists other tensors");
  }
  summary.hidden_size = int64_t{layers.hidden_size} * f;

  std::vector<TensorToWrite> tensors;
  tensors.reserve(layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    const CheckpointTensor& t = layout[i];
    ASSIGN_OR_RETURN(const WideningRule rule, RuleOf(t, *kind, head_norms));
    ASSIGN_OR_RETURN(const TensorView view, archive->Get(t.name));
    // Loaded in fp32 (exact for BF16/F16/F32 weights), scaled there, and
    // rounded once back to the source's dtype.
    ASSIGN_OR_RETURN(const at::Tensor w,
                     ToTensor(view, at::kFloat, c10::Device(c10::kCPU)));
    ASSIGN_OR_RETURN(const at::ScalarType dtype,
                     WeightScalarType(t.name, view.dtype));
    at::Tensor wide;
    RETURN_IF_ERROR(GuardTorch(
        [&] { wide = Widen(w, rule, f, features).to(dtype).contiguous(); }));
    const std::vector<int64_t> shape(wide.sizes().begin(), wide.sizes().end());
    if (t.name != wide_layout[i].name || shape != wide_layout[i].shape) {
      return absl::InternalError(
          absl::StrCat("widened ", t.name, " has shape ", ShapeToString(shape),
                       ", the widened layout says ", wide_layout[i].name, " ",
                       ShapeToString(wide_layout[i].shape)));
    }
    summary.parameters += wide.numel();
    summary.weight_bytes += static_cast<int64_t>(wide.nbytes());
    ASSIGN_OR_RETURN(TensorToWrite out, FromTensor(t.name, wide));
    tensors.push_back(std::move(out));
  }

  RETURN_IF_ERROR(MakeDirs(o.out_dir));
  RETURN_IF_ERROR(WriteSafetensors(o.out_dir + "/model.safetensors", tensors,
                                   {{"format", "pt"}}));
  tensors.clear();
  for (const char* name : kCarriedFiles) {
    const std::string path = o.from_dir + "/" + name;
    if (!PathExists(path)) continue;
    ASSIGN_OR_RETURN(const std::string contents, ReadFileToString(path));
    RETURN_IF_ERROR(WriteFileAtomically(o.out_dir + "/" + name, contents));
  }
  Json note;
  note["widened_from"] = o.from_dir;
  note["factor"] = f;
  note["exact"] = summary.exact;
  note["kind"] = *kind == CheckpointKind::kTarget ? "target" : "drafter";
  note["note"] =
      "Net2Net widening by dedit-train widen (training/widen.h): the "
      "residual stream is F copies of the source's, so this model computes "
      "the source's function (up to float summation order) while streaming "
      "F^2 times its weight bytes. A cost stand-in, not a new model.";
  RETURN_IF_ERROR(
      WriteFileAtomically(o.out_dir + "/widening.json", note.dump(2) + "\n"));
  // config.json last: a folder with it is complete.
  RETURN_IF_ERROR(WriteFileAtomically(o.out_dir + "/config.json", wide_text));
  return summary;
}

}  // namespace dedit::training
