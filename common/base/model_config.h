// Model configuration parsed from HuggingFace `config.json` files.
//
// Qwen3Config covers the dense Qwen3 target (`Qwen3ForCausalLM`) and the
// decoder-layer shape of a DFlash/DEdit drafter. DrafterConfig adds the
// drafter's block/feature settings. Parsing validates every field a model
// needs (presence, type, range, divisibility) and names the offending key in
// the error, so a malformed file is an INVALID_ARGUMENT, never a crash.
//
//   ASSIGN_OR_RETURN(Qwen3Config target, LoadQwen3Config(target_dir));
//   ASSIGN_OR_RETURN(DrafterConfig drafter,
//                    LoadDrafterConfig(drafter_dir, target.num_hidden_layers));
#ifndef DEDIT_BASE_MODEL_CONFIG_H_
#define DEDIT_BASE_MODEL_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dedit {

struct Qwen3Config {
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;  // defaults to hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;  // top-level or rope_parameters.rope_theta
  int max_position_embeddings = 40960;
  bool tie_word_embeddings = false;
  std::string dtype = "float32";  // torch_dtype or dtype
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;  // int or list in the file
};

struct DrafterConfig {
  Qwen3Config layers;   // the drafter's own decoder-layer shape
  int block_size = 16;  // top-level or dflash_config.block_size
  int mask_token_id = 0;
  std::vector<int> target_layer_ids;
  int num_target_layers = 0;
  // DEdit extension (`dedit_config`); a plain DFlash checkpoint is P1-only.
  int num_passes = 1;
  bool causal_editor = false;
  // Lookup-seeded P1 (`dedit_config.lookup_seed_ngram`, 0 = off): P1's
  // block input is the prompt lookup's proposal (common/engine/ngram_drafter.h,
  // min_ngram = this, max_ngram = max(this, 4)) where it has one and MASK
  // after it, so the passes edit the copy instead of drafting from masks.
  int lookup_seed_ngram = 0;
  // Trust in the seed (`dedit_config.seed_logit_bonus`, 0 = none, at most
  // kMaxSeedLogitBonus): every pass adds this to the logit of the seed's
  // token at each slot the seed covers, before the argmax and the
  // confidence, while the block follows its seed
  // (DEditDrafter::AddSeedBonus). A scalar fitted after training on
  // training prompts
  // (scripts/fit_seed_bonus.py): the network alone under-trusts right
  // seeds (docs/RESULTS.md, "Trusting the seed").
  double seed_logit_bonus = 0;
  bool has_dedit_config = false;
};

inline constexpr double kMaxSeedLogitBonus = 64;

absl::StatusOr<Qwen3Config> ParseQwen3Config(const std::string& json_text);
absl::StatusOr<DrafterConfig> ParseDrafterConfig(const std::string& json_text);

// Reads `<dir>/config.json`.
absl::StatusOr<Qwen3Config> LoadQwen3Config(const std::string& dir);
absl::StatusOr<DrafterConfig> LoadDrafterConfig(const std::string& dir);

// The default feature layers when a checkpoint does not name them:
// round(1 + i * (L - 4) / (n - 1)) for n features over L target layers
// ([1, 9, 17, 25, 33] for 36 / 5), clamped to valid layers.
std::vector<int> DefaultTargetLayerIds(int num_target_layers, int n);

// Checks a drafter against the target it will serve: hidden size, layer ids
// in range, mask token inside the vocabulary.
absl::Status CheckDrafterMatchesTarget(const DrafterConfig& drafter,
                                       const Qwen3Config& target);

// Serialises to HF-style config.json text (used by the tiny-model tool and
// the trainer).
std::string Qwen3ConfigToJson(const Qwen3Config& config);
std::string DrafterConfigToJson(const DrafterConfig& config);

}  // namespace dedit

#endif  // DEDIT_BASE_MODEL_CONFIG_H_
