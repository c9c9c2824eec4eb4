// Fuzz target: recipe TOML (configs/recipes/*.toml, a run's recipe.toml, a checkpoint's
// recipe_toml), through recipe_from_text, the parser of load_recipe_file and of checkpoints.
// Property: an accepted recipe re-serialises (recipe_to_toml) to text that parses to an
// equal Recipe, serialises to the same text again, and resolves to the same per-linear plans
// (resolve_linear_plans, or the same error) on a Llama-style and two hybrid models.
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/recipe/recipe.h"
#include "fuzz_common.h"

namespace {
// The linears of a hybrid block pattern, in model order (Model::linear_name's kinds).
std::vector<fp4::LinearSite> sites_of(const std::string& pattern) {
  std::vector<fp4::LinearSite> s;
  for (int b = 0; b < static_cast<int>(pattern.size()); ++b) {
    std::vector<std::string> kinds;
    if (pattern[b] == 'M') kinds = {"in_proj", "out_proj"};
    if (pattern[b] == '*') kinds = {"q_proj", "k_proj", "v_proj", "o_proj"};
    if (pattern[b] == '-') kinds = {"up_proj", "down_proj"};
    for (auto& k : kinds) s.push_back({b, k});
  }
  return s;
}

// resolve_linear_plans, or the error it throws, as comparable values.
struct Resolved {
  bool ok = false;
  std::string error;
  fp4::ResolvedLinears r;
};
Resolved resolve(const fp4::Recipe& rec, const std::vector<fp4::LinearSite>& sites, int n_blocks) {
  Resolved out;
  try {
    out.r = fp4::resolve_linear_plans(rec, sites, n_blocks);
    out.ok = true;
  } catch (const fp4::UserError& e) {
    out.error = e.what();
  }
  return out;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(fuzz::bytes(data, size));
  fp4::Recipe r;
  try {
    r = fp4::recipe_from_text(text, "fuzz.toml");
  } catch (const fp4::UserError&) {
    return 0;  // refused with a message: fine
  }
  const std::string t1 = fp4::recipe_to_toml(r);
  fp4::Recipe r2;
  try {
    r2 = fp4::recipe_from_text(t1, "fuzz.toml");
  } catch (const fp4::UserError& e) {
    FUZZ_CHECK(false, std::string("recipe_to_toml's text does not parse: ") + e.what() + "\n" + t1);
  }
  FUZZ_CHECK(r2.source == r.source, r2.source);
  FUZZ_CHECK(r2 == r, "re-parsed recipe differs\n" + t1);
  FUZZ_CHECK(fp4::recipe_to_toml(r2) == t1, "re-serialised text differs\n" + t1);
  const std::vector<std::string> patterns = {"*-*-", "M-M*-", "MM*-M-*-"};
  for (const std::string& p : patterns) {
    const auto sites = sites_of(p);
    const int n = static_cast<int>(p.size());
    const Resolved a = resolve(r, sites, n), b = resolve(r2, sites, n);
    FUZZ_CHECK(a.ok == b.ok && a.error == b.error, a.error + " | " + b.error);
    if (a.ok) {
      FUZZ_CHECK(a.r.plans == b.r.plans, "plans differ on " + p);
      FUZZ_CHECK(a.r.override_hits == b.r.override_hits, "override hits differ on " + p);
      FUZZ_CHECK(a.r.plans.size() == sites.size(), p);
    }
  }
  return 0;
}
