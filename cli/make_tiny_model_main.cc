// dedit-make-tiny-model: writes a random Qwen3 target and a matching DEdit
// drafter in the real HF checkpoint format (config.json + model.safetensors).
//
//   dedit-make-tiny-model --out /tmp/m --hidden 512 --layers 8 --vocab 32000
//   → /tmp/m/target, /tmp/m/drafter
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "cli/command_flags.h"
#include "common/model/tiny_model.h"

ABSL_FLAG(std::string, out, "", "output directory (target/ and drafter/)");
ABSL_FLAG(int, vocab, 128, "vocabulary size");
ABSL_FLAG(int, hidden, 64, "hidden size");
ABSL_FLAG(int, intermediate, 0, "MLP width (default 3 x hidden)");
ABSL_FLAG(int, layers, 4, "target decoder layers");
ABSL_FLAG(int, heads, 4, "attention heads");
ABSL_FLAG(int, kv_heads, 2, "key/value heads");
ABSL_FLAG(int, head_dim, 0, "head dim (default hidden / heads)");
ABSL_FLAG(int, drafter_layers, 2, "drafter decoder layers");
ABSL_FLAG(int, block_size, 32, "drafter block size (largest W)");
ABSL_FLAG(int, passes, 3, "dedit_config.num_passes");
ABSL_FLAG(int, max_positions, 4096, "max_position_embeddings");
ABSL_FLAG(std::string, dtype, "float32", "float32 or bfloat16 on disk");
ABSL_FLAG(uint64_t, seed, 1, "random seed");

int main(int argc, char** argv) {
  const dedit::CommandFlags command = {
      "dedit-make-tiny-model",
      "--out DIR [--vocab N --hidden N --layers N ...]",
      "Writes a random Qwen3 target and a matching DEdit drafter to\n"
      "DIR/target and DIR/drafter in the real checkpoint format.\n",
      {"out", "vocab", "hidden", "intermediate", "layers", "heads", "kv_heads",
       "head_dim", "drafter_layers", "block_size", "passes", "max_positions",
       "dtype", "seed"}};
  if (std::optional<int> exit = dedit::ParseCommandFlags(
          command, argv[0], std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit;
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "--out is required\n");
    return 2;
  }
  dedit::TinyModelSpec spec = dedit::DefaultTinySpec();
  dedit::Qwen3Config& t = spec.target;
  t.vocab_size = absl::GetFlag(FLAGS_vocab);
  t.hidden_size = absl::GetFlag(FLAGS_hidden);
  t.intermediate_size = absl::GetFlag(FLAGS_intermediate) > 0
                            ? absl::GetFlag(FLAGS_intermediate)
                            : 3 * t.hidden_size;
  t.num_hidden_layers = absl::GetFlag(FLAGS_layers);
  t.num_attention_heads = absl::GetFlag(FLAGS_heads);
  t.num_key_value_heads = absl::GetFlag(FLAGS_kv_heads);
  t.head_dim = absl::GetFlag(FLAGS_head_dim) > 0
                   ? absl::GetFlag(FLAGS_head_dim)
                   : t.hidden_size / t.num_attention_heads;
  t.max_position_embeddings = absl::GetFlag(FLAGS_max_positions);
  t.dtype = absl::GetFlag(FLAGS_dtype);
  dedit::DrafterConfig& d = spec.drafter;
  d.layers = t;
  d.layers.num_hidden_layers = absl::GetFlag(FLAGS_drafter_layers);
  d.block_size = absl::GetFlag(FLAGS_block_size);
  d.num_passes = absl::GetFlag(FLAGS_passes);
  d.mask_token_id = t.vocab_size - 1;
  d.num_target_layers = t.num_hidden_layers;
  d.target_layer_ids = dedit::DefaultTargetLayerIds(
      t.num_hidden_layers, std::min(3, t.num_hidden_layers));
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  absl::Status s = dedit::WriteRandomQwen3(out + "/target", t, seed);
  if (s.ok()) s = dedit::WriteRandomDrafter(out + "/drafter", d, seed + 1);
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s/target and %s/drafter\n", out.c_str(), out.c_str());
  return 0;
}
