// TEMPORARY stand-in for the checkpoint functions of fp4/checkpoint.h on branch `eval`, linked
// into fp4train only while the library has no implementation (see CMakeLists.txt). Each throws
// a clear error. Delete this file and its CMake block once checkpoints are implemented.
#include "fp4/checkpoint.h"
#include "fp4/error.h"

namespace fp4 {
namespace {
[[noreturn]] void missing(const std::string& what) {
  throw UserError("checkpoint support is not built into this fp4train (" + what +
                  " is not implemented on this branch)");
}
}  // namespace
void save_checkpoint(const std::filesystem::path&, const Checkpoint&) { missing("save_checkpoint"); }
Checkpoint load_checkpoint(const std::filesystem::path& f) { missing("load_checkpoint " + f.string()); }
std::filesystem::path resolve_checkpoint(const std::filesystem::path& p, std::string*) {
  missing("resolve_checkpoint " + p.string());
}
RunConfig run_config_from_text(const std::string&, const std::string& w) { missing("run_config_from_text " + w); }
Recipe recipe_from_text(const std::string&, const std::string& w) { missing("recipe_from_text " + w); }
}  // namespace fp4
