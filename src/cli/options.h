// CLI11 pieces shared by the subcommands: the `--set` option and the --peak-gflops check.
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
}  // namespace fp4::cli
