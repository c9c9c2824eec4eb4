// Command-line overrides of run-config and recipe keys: `--set KEY=VALUE` (docs/cli.md
// "Command-line overrides"). The value is applied to the parsed TOML of the config or recipe
// file before it is read, so it gets exactly the validation a value in the file gets; errors
// name the --set argument instead of the file.
#pragma once
#include <string>
#include <vector>

namespace fp4 {

/// One `--set KEY=VALUE` argument, parsed.
struct Setting {
  std::string arg;    ///< the argument as given, for messages: "--set fp4.block=32"
  std::string key;    ///< the dotted key inside its file: "train.lr", "fp4.block", "name",
                      ///< "override[0].scale_target" (a `recipe.` prefix removed)
  std::string value;  ///< the value as one TOML value literal: "32", "\"e4m3\"", "[0, 1]"
  std::string label;  ///< "fp4.block=32": the key and the value (a string without its
                      ///< quotes, anything else without whitespace), for names
};

/// The `--set` arguments of one command, split by the file they change.
struct Settings {
  std::vector<Setting> config;  ///< keys of the run config: [model] [train] [data] [eval] [log]
  std::vector<Setting> recipe;  ///< keys of the recipe: name, description, [linear] [fp4]
                                ///< [rounding] [high_precision] [[override]]
  std::vector<std::string> given;  ///< every argument as given ("KEY=VALUE"), in order
  bool empty() const { return config.empty() && recipe.empty(); }
};

/// Parse `--set` arguments ("KEY=VALUE", without the "--set"). KEY is a dotted TOML key path:
/// config keys by their table (`train.lr`, `model.d_model`, `data.path`, `eval.windows`,
/// `log.progress_seconds`), recipe keys by theirs (`fp4.block`, `linear.mode`, `rounding.dy`,
/// `high_precision.final_blocks`, `override[0].scale_target` for an [[override]] the recipe
/// file has) or with a `recipe.` prefix (`recipe.fp4.block`; needed for the top-level
/// `recipe.name` and `recipe.description`). VALUE is a TOML value (`32`, `1e-3`, `true`,
/// `"e4m3"`, `[0, 1]`); text that is not one is taken as a string (`e4m3`), except text
/// starting with a quote, `[` or `{`, which must be a valid TOML value.
/// Throws fp4::UserError naming the argument: no '=', an empty key or value, an unknown
/// table (the known ones listed), a malformed key or TOML value, a key given twice.
/// Unknown keys inside a known table, wrong types and out-of-range values are found when the
/// settings are applied (load_run_config, load_recipe).
Settings parse_settings(const std::vector<std::string>& args);

/// `where` (a file name) followed by " with --set a=1 --set b=2", or `where` if `sets` is
/// empty: the source named by cross-key errors of an overridden config or recipe.
std::string with_settings(const std::string& where, const std::vector<Setting>& sets);

/// `name` labelled by the settings: "name+fp4.block=32+rounding.dy=rne" (each Setting::label,
/// in order); `name` itself when `sets` is empty. Settings of keys that change no result
/// (names_no_result) add no label, so they rename neither the config nor the run directory.
std::string labelled_name(const std::string& name, const std::vector<Setting>& sets);

/// Whether a config key changes nothing a run computes or reports, only where or how often it
/// works: data.cache (where the token cache lives) and log.progress_seconds.
bool names_no_result(const std::string& key);

}  // namespace fp4
