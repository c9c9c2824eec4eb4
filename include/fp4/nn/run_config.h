// Run configs read with the block kinds of the mixer registry (fp4/nn/mixer.h): the entry
// points for every caller above nn. The parser (fp4/config/config.h) knows no kind; these
// functions give it the registered ones, so a kind's pattern character, its name in errors and
// its cross-key checks come from its MixerKind entry. A header apart from mixer.h: its callers
// (train, study, cli, python) read configs and need none of the Mixer interface.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "fp4/config/config.h"

namespace fp4 {

namespace nn {
/// The registered kinds as the parser needs them: their symbols, their listing for the
/// pattern error, and check_block_kinds as the cross-key check. Built on each call (a kind
/// registered later is included).
BlockKindRules block_kind_rules();
}  // namespace nn

/// Parse and validate a run config (parse_run_config_file with nn::block_kind_rules()).
/// Unknown sections/keys, wrong types and out-of-range values throw fp4::UserError naming the
/// file, key and allowed range. `sets` (the config part of parse_settings) override keys of
/// the file first and are validated as the file's values are; their errors name the --set
/// argument, cross-key errors the file "with --set ...".
RunConfig load_run_config(const std::filesystem::path& file, const std::vector<Setting>& sets = {});
/// Check cross-field constraints (d_model % n_heads, even head dim, the Mamba-2 heads and
/// groups, batch and micro-batch, ...); throws UserError prefixed `where`.
void validate(const RunConfig& c, const std::string& where);
/// Parse run-config TOML text (e.g. the resolved config stored in a checkpoint); `where`
/// names the source in error messages. Throws fp4::UserError like load_run_config.
RunConfig run_config_from_text(const std::string& toml, const std::string& where);

}  // namespace fp4
