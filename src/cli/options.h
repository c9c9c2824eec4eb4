// CLI11 pieces shared by the subcommands: the `--set` option, the --recipe and --peak-gflops
// checks and whole numbers written as 1e9.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace fp4::cli {
/// Add the repeatable `--set KEY=VALUE` option of `c`, collecting the arguments in `sets`
/// (parse them with fp4::parse_set_args, fp4/train/resolved_run.h). `extra` ends the help
/// text (what it applies to).
void add_set_option(CLI::App* c, std::vector<std::string>& sets, const std::string& extra);
/// CLI11 check of --peak-gflops: a number of GFLOP/s in [0.01, 1e6]; the message (which CLI11
/// prefixes with the option) says whether it is not a number or out of range.
std::string check_peak_gflops(const std::string& text);
/// CLI11 check of a recipe option (--recipe): a name or path, never empty (an empty value would
/// otherwise mean "no recipe" and fail later with a message about the model's plans).
std::string check_recipe_arg(const std::string& text);
/// An integer option's value as CLI11 converts it: "1e9" or "2.5e3" (a whole number in
/// scientific or decimal notation, as step and token counts are often written) becomes
/// "1000000000" / "2500"; a plain integer is returned unchanged. Throws CLI::ValidationError
/// (which CLI11 prefixes with the option) for a value that is not a whole number ("1.5",
/// "abc") or lies outside the 64-bit integers.
std::string whole_number(const std::string& text);
/// Give every integer option (CLI11 type INT or UINT) of `app` and of its subcommands the
/// whole_number transform, ahead of its range check, so `--steps 1e9` means 10^9 steps.
void accept_whole_numbers(CLI::App& app);
/// "a,b" and repeated options → one list, blanks trimmed, empties dropped.
std::vector<std::string> split_list(const std::vector<std::string>& in);
/// A comma list of checkpoint steps (whole numbers in any notation, ≥ 0). Throws
/// fp4::UserError "<option>: 'x' is not a step number (a comma list of checkpoint steps)".
std::vector<int64_t> parse_step_list(const std::string& list, const std::string& option);
}  // namespace fp4::cli
