// Run configs with the registered block kinds (fp4/nn/run_config.h).
#include "fp4/nn/run_config.h"

#include "fp4/nn/mixer.h"

namespace fp4 {

namespace nn {
BlockKindRules block_kind_rules() {
  BlockKindRules r;
  for (const MixerKind& k : mixer_kinds()) r.symbols += k.symbol;
  r.listing = mixer_kinds_listing();
  r.check = [](const ModelConfig& m, const std::function<void(const std::string&)>& fail) {
    check_block_kinds(m, fail);
  };
  return r;
}
}  // namespace nn

RunConfig load_run_config(const std::filesystem::path& file, const std::vector<Setting>& sets) {
  return parse_run_config_file(file, sets, nn::block_kind_rules());
}

void validate(const RunConfig& c, const std::string& where) {
  validate_run_config(c, where, nn::block_kind_rules());
}

RunConfig run_config_from_text(const std::string& toml, const std::string& where) {
  return parse_run_config_text(toml, where, nn::block_kind_rules());
}

}  // namespace fp4
