#include "common/model/in_process.h"

#include "common/base/status.h"
#include "common/model/tensor_io.h"

namespace dedit {

absl::StatusOr<std::unique_ptr<InProcessStack>> InProcessStack::Load(
    const Options& options) {
  ASSIGN_OR_RETURN(c10::Device device, ParseDevice(options.device));
  ASSIGN_OR_RETURN(at::ScalarType dtype, ParseScalarType(options.dtype));
  std::unique_ptr<InProcessStack> s(new InProcessStack);
  Qwen3Model::Options topts;
  topts.device = device;
  topts.dtype = dtype;
  std::optional<DrafterConfig> dconfig;
  if (!options.drafter_dir.empty()) {
    ASSIGN_OR_RETURN(dconfig, LoadDrafterConfig(options.drafter_dir));
    topts.feature_layer_ids = dconfig->target_layer_ids;
  }
  ASSIGN_OR_RETURN(s->target_, Qwen3Model::Load(options.target_dir, topts));
  if (dconfig) {
    RETURN_IF_ERROR(CheckDrafterMatchesTarget(*dconfig, s->target_->config()));
    DEditDrafter::Options dopts;
    dopts.device = device;
    dopts.dtype = dtype;
    dopts.max_context_tokens = s->target_->config().max_position_embeddings;
    ASSIGN_OR_RETURN(
        s->drafter_,
        DEditDrafter::Load(options.drafter_dir, s->target_->embed_tokens(),
                           s->target_->lm_head(), dopts));
    if (options.causal_editor) {
      s->drafter_->set_causal_editor(*options.causal_editor);
    }
    s->local_drafter_ = std::make_unique<LocalDrafter>(s->drafter_.get());
  }
  s->verifier_ = std::make_unique<LocalVerifier>(s->target_.get(),
                                                 s->local_drafter_.get());
  SpeculativeEngine::Options eopts;
  const Qwen3Config& c = s->target_->config();
  eopts.eos_token_ids = c.eos_token_ids;
  eopts.vocab_size = c.vocab_size;
  eopts.max_context = c.max_position_embeddings;
  eopts.speculation = options.speculation;
  s->engine_ = std::make_unique<SpeculativeEngine>(
      s->verifier_.get(), s->local_drafter_.get(), eopts);
  return s;
}

}  // namespace dedit
