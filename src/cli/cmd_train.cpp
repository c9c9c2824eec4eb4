#include "commands.h"
namespace fp4::cli {
void register_train(CLI::App& app) { app.add_subcommand("train", "Pretrain a model (not yet implemented)"); }
}  // namespace fp4::cli
