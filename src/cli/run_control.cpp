#include "run_control.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "fp4/dist.h"
#include "fp4/error.h"

namespace fp4::cli {

void add_set_option(CLI::App* c, std::vector<std::string>& sets, const std::string& extra) {
  c->add_option("--set", sets,
                "KEY=VALUE, repeatable: override a key of the run config by its TOML table path "
                "(train.lr=1e-3, model.n_layers=2, eval.interval=50, data.path=...) or of the "
                "recipe by its table path or with a recipe. prefix (fp4.block=32, "
                "rounding.dy=rne, high_precision.final_blocks=1, override[0].scale_target=2048, "
                "recipe.name=mine). VALUE is a TOML value (32, 1e-3, true, \"e4m3\", [0, 1]); "
                "a bare word is a string. Checked like the same key in the file (exit 2 naming "
                "the --set). A changed recipe is named RECIPE+KEY=VALUE (unless recipe.name is "
                "set), a changed config CONFIG+KEY=VALUE; the run's config.toml and recipe.toml "
                "hold the resolved values" + extra)
      ->allow_extra_args(false)
      ->take_all();
}

Settings parse_set_args(const std::vector<std::string>& args,
                        const std::vector<std::pair<std::string, std::string>>& taken) {
  Settings s = parse_settings(args);
  for (const Setting& x : s.config)
    for (const auto& [key, option] : taken)
      if (x.key == key)
        throw UserError(x.arg + " and " + option + " both set " + key + "; give one of them");
  return s;
}

std::string dir_safe(const std::string& name) {
  std::string d = name;
  for (char& c : d)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
          c == '+' || c == '=' || c == ','))
      c = '_';
  if (d.empty() || d[0] == '.') d = "_" + d;
  return d;
}

std::string shell_word(const std::string& s) {
  bool plain = !s.empty();
  for (char c : s)
    plain &= std::isalnum(static_cast<unsigned char>(c)) ||
             std::string("._+=,/:@%-").find(c) != std::string::npos;
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string signal_name(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGUSR1) return "SIGUSR1";
  return "signal " + std::to_string(sig);
}

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_quiet = 0;  // an MPI rank other than 0: print nothing

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {
    // The second signal: die of it now (it is blocked while this handler runs and delivered,
    // with the default action, when it returns).
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);
    return;
  }
  g_stop_signal = sig;
  if (g_quiet) return;
  static const char msg[] =
      "\nfp4train: stopping after the current step (a checkpoint is written first); a second "
      "Ctrl-C or signal stops at once\n";
  ssize_t r = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)r;
}

bool install(int sig, struct sigaction& old) {
  if (sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) return false;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // file writes and reads in progress are not cut short
  return sigaction(sig, &sa, nullptr) == 0;
}
}  // namespace

StopOnSignal::StopOnSignal() {
  g_stop_signal = 0;
  g_quiet = dist::rank() > 0;
  int_installed_ = install(SIGINT, old_int_);
  term_installed_ = install(SIGTERM, old_term_);
  usr1_installed_ = install(SIGUSR1, old_usr1_);
}

StopOnSignal::~StopOnSignal() {
  if (int_installed_) sigaction(SIGINT, &old_int_, nullptr);
  if (term_installed_) sigaction(SIGTERM, &old_term_, nullptr);
  if (usr1_installed_) sigaction(SIGUSR1, &old_usr1_, nullptr);
}

const volatile std::sig_atomic_t* StopOnSignal::flag() { return &g_stop_signal; }

void StopOnSignal::exit_by(int sig) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (dist::size() > 1) {
    dist::finalize();
    std::exit(128 + sig);
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  raise(sig);
  std::_Exit(128 + sig);
}

}  // namespace fp4::cli
