#include "commands.h"
namespace fp4::cli {
void register_quant(CLI::App& app) { app.add_subcommand("quant", "Inspect block quantization (not yet implemented)"); }
}  // namespace fp4::cli
