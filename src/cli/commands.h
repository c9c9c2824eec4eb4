// Subcommands of the fp4train program. Each registers itself on the CLI11 app and
// runs through the callback it installs; errors are thrown as fp4::UserError.
#pragma once
#include <CLI/CLI.hpp>

namespace fp4::cli {
void register_quant(CLI::App& app);
void register_gemm(CLI::App& app);
void register_train(CLI::App& app);
void register_eval(CLI::App& app);
void register_sample(CLI::App& app);
void register_compare(CLI::App& app);  // compare, report, noise and compact
void register_profile(CLI::App& app);
void register_info(CLI::App& app);    // model size, FLOPs, memory and linear plan
void register_export(CLI::App& app);  // Hugging Face style directory of a checkpoint
void register_list(CLI::App& app);    // configs and recipes: the shipped files, one line each
void register_data(CLI::App& app);    // what a data source holds; builds or exports its token cache
void register_fidelity(CLI::App& app);  // recipes against exact FP32 on shared checkpoints and batches
void register_rollout(CLI::App& app);   // paired rollouts of recipes from shared checkpoints

}  // namespace fp4::cli
