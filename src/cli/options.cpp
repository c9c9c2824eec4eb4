// CLI11 pieces shared by the subcommands (options.h).
#include "options.h"

#include "fp4/base/error.h"

#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

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

std::string check_recipe_arg(const std::string& text) {
  if (text.find_first_not_of(" \t") == std::string::npos)
    return "an empty recipe (give a name in configs/recipes/ or a recipe .toml path)";
  return "";
}

std::string check_peak_gflops(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0')
    return "'" + text + "' is not a number (GFLOP/s, e.g. 250)";
  if (!std::isfinite(v) || v < 0.01 || v > 1e6)
    return text + " is not a GFLOP/s rate in [0.01, 1e6]";
  return "";
}

std::string whole_number(const std::string& text) {
  // A plain integer (optional sign, digits): CLI11's own conversion and range check decide.
  const size_t digits_from = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  if (text.size() > digits_from &&
      text.find_first_not_of("0123456789", digits_from) == std::string::npos)
    return text;
  char* end = nullptr;
  const long double v = std::strtold(text.c_str(), &end);
  const bool numeral = !text.empty() && end != text.c_str() && *end == '\0' &&
                       text.find_first_of("xXnNiI") == std::string::npos;  // no hex, nan, inf
  if (!numeral || v != std::floor(v))
    throw CLI::ValidationError("'" + text + "' is not a whole number");
  if (std::fabs(v) >= 9.2e18L) throw CLI::ValidationError(text + " is out of range");
  return std::to_string(static_cast<long long>(v));
}

void accept_whole_numbers(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    const std::string type = o->get_type_name();
    if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0)
      o->transform(CLI::Validator(
          [](std::string& v) {
            v = whole_number(v);
            return std::string();
          },
          "", "whole number"));
  }
  for (CLI::App* sub : app.get_subcommands({})) accept_whole_numbers(*sub);
}

std::vector<std::string> split_list(const std::vector<std::string>& in) {
  std::vector<std::string> out;
  for (const std::string& s : in) {
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
      const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
      if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
    }
  }
  return out;
}

std::vector<int64_t> parse_step_list(const std::string& list, const std::string& option) {
  std::vector<int64_t> steps;
  for (const std::string& s : split_list({list})) {
    try {
      // A whole number in any notation (1e3), as every integer option takes.
      const std::string w = whole_number(s);
      size_t used = 0;
      const long long v = std::stoll(w, &used);
      if (used != w.size() || v < 0) throw std::invalid_argument(s);
      steps.push_back(v);
    } catch (const std::exception&) {
      throw UserError(option + ": '" + s + "' is not a step number (a comma list of checkpoint steps)");
    }
  }
  return steps;
}

}  // namespace fp4::cli
