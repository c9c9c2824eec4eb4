// fp4train: pretrain language models with FP4 block-scaled linear layers and compare recipes.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <utility>

#include "commands.h"
#include "omp_wait.h"
#include "options.h"
#include "fp4/base/cpu_isa.h"
#include "fp4/dist/dist.h"
#include "fp4/base/error.h"
#include "fp4/gemm/gemm.h"     // gemm_bf16_env_error
#include "fp4/gemm/machine.h"  // compute_paths, for --version
#include "fp4/base/safetensors.h"  // fp4::IoError

namespace {
/// Ends MPI (fp4::dist::finalize) on every return from main; a no-op without mpirun.
struct DistGuard {
  DistGuard() = default;
  DistGuard(const DistGuard&) = delete;
  DistGuard& operator=(const DistGuard&) = delete;
  ~DistGuard() { fp4::dist::finalize(); }
};

/// A command's error: one line on stderr and `code`. Under mpirun with several processes the
/// error may be this rank's alone while the others wait in a collective, so every process of
/// the run is ended (fp4::dist::abort_all) instead of returning.
int command_error(const char* what, int code) {
  if (fp4::dist::size() > 1) fp4::dist::abort_all(std::string("fp4train: error: ") + what, code);
  std::fprintf(stderr, "fp4train: error: %s\n", what);
  return code;
}
/// The top-level --help lists each command with one line, a whole sentence ending in a full
/// stop (kCommandSummaries; tests/cli/help_cli.sh checks every line); `CMD --help` prints the
/// command's full description, as before.
const std::pair<const char*, const char*> kCommandSummaries[] = {
    {"train", "Pretrain a model (Llama-style or the Nemotron-H hybrid) on text with one recipe."},
    {"compare", "Train recipes x seeds on one config, then write a comparison report."},
    {"report", "Rebuild a comparison's report.md and plots from its finished runs."},
    {"noise", "The seed noise of finished comparisons, as compare's power estimate reads it."},
    {"compact",
     "Compress finished runs' metrics.jsonl into metrics.jsonl.zst (report reads both)."},
    {"eval", "Held-out NLL, or a downstream task, of a checkpoint under quantized inference."},
    {"sample", "Generate text from a checkpoint."},
    {"export", "Write a checkpoint as a Hugging Face style directory or a GGUF file for llama.cpp."},
    {"profile", "Where a training step's time goes, per component, and model FLOPs utilization."},
    {"info", "Parameters, FLOPs, step memory and every linear's mode of a config and recipe."},
    {"quant", "Quantize a matrix with block-scaled FP4; print scales, codes and values."},
    {"gemm", "Quantize two matrices and print their emulated FP4 product."},
    {"configs", "List the shipped run configs."},
    {"recipes", "List the shipped recipes."},
    {"data", "What a run's data source holds (splits, vocabulary, token cache), before a run."},
    {"fidelity",
     "Each recipe's gradient and loss error against exact FP32 on a run's checkpoints."},
    {"rollout", "Each recipe's gap to fp32 over N steps trained from a run's shared checkpoints."},
};

/// A command's line in the top-level --help: its summary, or for a command without one the
/// first sentence of its description (its line breaks as spaces), never a clipped line.
std::string command_summary(const CLI::App* sub) {
  for (const auto& [name, summary] : kCommandSummaries)
    if (sub->get_name() == name) return summary;
  std::string text = sub->get_description();
  for (char& c : text)
    if (c == '\n') c = ' ';
  const size_t end = text.find(". ");
  return end == std::string::npos ? text : text.substr(0, end + 1);
}

class OneLineCommands : public CLI::Formatter {
 public:
  std::string make_subcommand(const CLI::App* sub) const override {
    std::stringstream out;
    CLI::detail::format_help(out, sub->get_display_name(true), command_summary(sub), column_width_);
    return out.str();
  }
};
}  // namespace

int main(int argc, char** argv) {
  // Passive OpenMP waiting unless the user chose (re-executes this program once; omp_wait.h).
  fp4::cli::default_omp_wait_policy(argv);
  // MPI first (only when started by mpirun): it may consume its own arguments.
  try {
    fp4::dist::init(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp4train: error: %s\n", e.what());
    return 2;
  }
  DistGuard dist_guard;
  // Under mpirun rank 0 alone prints results and progress; the other ranks' stdout goes to
  // /dev/null (their errors still reach stderr, prefixed with the rank).
  if (fp4::dist::rank() > 0 && !std::freopen("/dev/null", "w", stdout)) return 2;
  bool help = false;
  for (int i = 1; i < argc; ++i) help |= std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h";
  if (const std::string bad = fp4::cpu_isa_env_error(); !bad.empty() && !help) {
    std::fprintf(stderr, "fp4train: error: %s\n", bad.c_str());
    return 2;
  }
  if (const char* g = std::getenv("FP4_BF16_GEMM"); g && *g && !help) {
    if (const std::string bad = fp4::gemm_bf16_env_error(); !bad.empty()) {
      std::fprintf(stderr, "fp4train: error: %s\n", bad.c_str());
      return 2;
    }
  }
  CLI::App app{
      "fp4train: pretrain language models with FP4 (E2M1, block-scaled) linear layers on CPUs and\n"
      "compare FP4 recipes (UE5M3, NVFP4, MXFP4) with BF16 and FP32. First run: bash scripts/demo.\n"
      "'fp4train CMD --help' explains a command; 'fp4train configs' and 'fp4train recipes' list\n"
      "the shipped models and recipes. README.md and docs/ hold the rest."};
  // One line per command here, the details under `fp4train CMD --help` (as git and cargo do).
  app.formatter(std::make_shared<OneLineCommands>());
  // --version: the version and the compute paths this machine would use (as `info` prints).
  app.set_version_flag("--version", [] {
    return std::string("fp4train ") + FP4_VERSION + "\ncompute: " + fp4::prof::compute_paths().line();
  });
  app.require_subcommand(1);
  fp4::cli::register_train(app);
  fp4::cli::register_eval(app);
  fp4::cli::register_sample(app);
  fp4::cli::register_quant(app);
  fp4::cli::register_gemm(app);
  fp4::cli::register_compare(app);
  fp4::cli::register_profile(app);
  fp4::cli::register_info(app);
  fp4::cli::register_export(app);
  fp4::cli::register_list(app);
  fp4::cli::register_data(app);
  fp4::cli::register_fidelity(app);
  fp4::cli::register_rollout(app);
  // Integer options take 1e9 as well as 1000000000 (options.h, whole_number).
  fp4::cli::accept_whole_numbers(app);
  if (argc > 1 && argv[1][0] != '-') {
    const std::string cmd = argv[1];
    bool known = false;
    std::string names;
    for (auto* s : app.get_subcommands({})) {
      known |= s->get_name() == cmd;
      names += (names.empty() ? "" : ", ") + s->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "fp4train: error: unknown command '%s' (commands: %s; see --help)\n",
                   cmd.c_str(), names.c_str());
      return 2;
    }
    // Only train, profile, fidelity and rollout spread their work over MPI processes; the other
    // commands would each run whole on every rank and write the same files at once.
    if (fp4::dist::size() > 1 && cmd != "train" && cmd != "profile" && cmd != "fidelity" && cmd != "rollout" &&
        !help)
      return command_error(("'" + cmd + "' runs in one process; under mpirun use 'train', 'profile', "
                            "'fidelity' or 'rollout', then run '" + cmd + "' without mpirun")
                               .c_str(),
                           2);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help (and CLI11's other "success" exits) print and exit 0. Every other parse error
    // (unknown option, missing argument, a value that does not convert to the option's type
    // or fails its range check) is a bad argument: one line on stderr, exit 2, like the
    // commands' own checks (fp4::UserError below). CLI11's own codes (104, 105, ...) never
    // reach the shell.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::string what = e.what();
    if (e.get_name() == "ConversionError")
      what += " (malformed, or out of the range of the option's type)";
    for (char& c : what)
      if (c == '\n') c = ' ';  // one line
    const std::string cmd = argc > 1 && argv[1][0] != '-' ? std::string(" ") + argv[1] : "";
    std::fprintf(stderr, "fp4train: error: %s; see 'fp4train%s --help'\n", what.c_str(),
                 cmd.c_str());
    return 2;
  } catch (const fp4::IoError& e) {  // a full disk or an I/O error: a failure, not bad input
    return command_error(e.what(), 1);
  } catch (const fp4::UserError& e) {
    return command_error(e.what(), 2);
  } catch (const std::exception& e) {
    return command_error(e.what(), 1);
  }
  return 0;
}
