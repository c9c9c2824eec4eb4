// Fuzz target: run-config TOML (configs/*.toml, a run's config.toml, a checkpoint's
// config_toml), through parse_run_config_text, the parser of load_run_config and checkpoints.
// The fuzz build has no model code, so the block kinds are given here as the parser sees
// them: the built-in pattern characters, without the kinds' cross-key checks (those are the
// mixer registry's, tested in tests/nn/test_hybrid.cpp and test_mixer_registry.cpp).
// Property: an accepted config re-serialises (run_config_to_toml) to text that parses to the
// same config, and to the same text again. "The same": equal field by field, after the
// normalisations run_config_to_toml documents (it writes the block pattern, never n_layers;
// micro_batch_size only where it splits the batch; the Mamba-2 keys only for a pattern with
// 'M' blocks, which alone use them).
#include <string>

#include "fp4/config/config.h"
#include "fp4/base/error.h"
#include "fuzz_common.h"

namespace {
fp4::BlockKindRules kinds() {
  fp4::BlockKindRules k;
  k.symbols = "M*-";
  k.listing = "'M' (Mamba-2), '*' (attention) and '-' (MLP)";
  return k;
}

fp4::RunConfig normalised(fp4::RunConfig c) {
  c.model.pattern = c.model.block_pattern();
  c.model.n_layers = 0;
  if (c.train.micro() == c.train.batch_size) c.train.micro_batch_size = 0;
  if (c.model.pattern.find('M') == std::string::npos) {
    const fp4::ModelConfig d;
    auto& m = c.model;
    m.mamba_num_heads = d.mamba_num_heads;
    m.mamba_head_dim = d.mamba_head_dim;
    m.mamba_n_groups = d.mamba_n_groups;
    m.mamba_state_size = d.mamba_state_size;
    m.mamba_conv_kernel = d.mamba_conv_kernel;
    m.mamba_chunk_size = d.mamba_chunk_size;
    m.mamba_dt_min = d.mamba_dt_min;
    m.mamba_dt_max = d.mamba_dt_max;
    m.mamba_dt_init_floor = d.mamba_dt_init_floor;
  }
  return c;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(fuzz::bytes(data, size));
  fp4::RunConfig c;
  try {
    c = fp4::parse_run_config_text(text, "fuzz.toml", kinds());
  } catch (const fp4::UserError&) {
    return 0;
  }
  const std::string t1 = fp4::run_config_to_toml(c);
  fp4::RunConfig c2;
  try {
    c2 = fp4::parse_run_config_text(t1, "fuzz.toml", kinds());
  } catch (const fp4::UserError& e) {
    FUZZ_CHECK(false, std::string("run_config_to_toml's text does not parse: ") + e.what() + "\n" + t1);
  }
  FUZZ_CHECK(normalised(c2) == normalised(c), "re-parsed config differs\n" + t1);
  FUZZ_CHECK(fp4::run_config_to_toml(c2) == t1, "re-serialised text differs\n" + t1);
  return 0;
}
