// Fuzzes both config.json kinds (target Qwen3 and DFlash/DEdit drafter).
// Invariants for an accepted config: every bounded field is in its range,
// the layer ids fit the target, and the config survives a round trip
// through the writer unchanged.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/base/model_config.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

void CheckTarget(const dedit::Qwen3Config& c) {
  FUZZ_CHECK(c.vocab_size >= 1 && c.hidden_size >= 1);
  FUZZ_CHECK(c.num_hidden_layers >= 1 && c.num_hidden_layers <= 1024);
  FUZZ_CHECK(c.num_attention_heads % c.num_key_value_heads == 0);
  FUZZ_CHECK(c.head_dim >= 2 && c.head_dim % 2 == 0);
  FUZZ_CHECK(c.eos_token_ids.size() <= 1024);
  for (int id : c.eos_token_ids) FUZZ_CHECK(id >= 0 && id < c.vocab_size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto target = dedit::ParseQwen3Config(text);
  if (target.ok()) {
    CheckTarget(*target);
    auto again = dedit::ParseQwen3Config(dedit::Qwen3ConfigToJson(*target));
    FUZZ_CHECK(again.ok());
    FUZZ_CHECK(again->num_hidden_layers == target->num_hidden_layers);
    FUZZ_CHECK(again->eos_token_ids == target->eos_token_ids);
    FUZZ_CHECK(again->dtype == target->dtype);
  }
  auto drafter = dedit::ParseDrafterConfig(text);
  if (drafter.ok()) {
    CheckTarget(drafter->layers);
    FUZZ_CHECK(drafter->num_target_layers >= 1 &&
               drafter->num_target_layers <= 1024);
    FUZZ_CHECK(drafter->block_size >= 2 && drafter->block_size <= 1024);
    FUZZ_CHECK(drafter->target_layer_ids.size() <= 1024);
    for (int id : drafter->target_layer_ids) {
      FUZZ_CHECK(id >= 0 && id < drafter->num_target_layers);
    }
    auto again =
        dedit::ParseDrafterConfig(dedit::DrafterConfigToJson(*drafter));
    FUZZ_CHECK(again.ok());
    FUZZ_CHECK(again->target_layer_ids == drafter->target_layer_ids);
    FUZZ_CHECK(again->mask_token_id == drafter->mask_token_id);
  }
  return 0;
}
