// `--set KEY=VALUE` command-line overrides: parsing and naming (fp4/config/settings.h). Applying them
// is TomlReader::apply (fp4/config/toml_reader.h), called by the config and recipe loaders.
#include "fp4/config/settings.h"

#include <toml++/toml.h>

#include <cctype>

#include "fp4/base/error.h"
#include "fp4/config/toml_reader.h"

namespace fp4 {
namespace {
const char* const kConfigTables[] = {"model", "train", "data", "eval", "log"};
const char* const kRecipeTables[] = {"linear", "fp4", "rounding", "high_precision", "override"};
const char* const kRecipeTopKeys[] = {"name", "description"};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t") + 1 - a);
}

// Segments of a dotted key: bare TOML keys [A-Za-z0-9_-]+, each may carry one array index
// "[N]" of at most 6 digits (the caller allows it on override only). Throws on anything else
// (quoted keys are not supported).
std::vector<std::string> key_segments(const std::string& arg, const std::string& key) {
  std::vector<std::string> segs;
  size_t pos = 0;
  while (true) {
    const size_t dot = key.find('.', pos);
    const std::string seg = key.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool ok = !seg.empty();
    size_t i = 0;
    while (i < seg.size() && (std::isalnum(static_cast<unsigned char>(seg[i])) || seg[i] == '_' || seg[i] == '-')) ++i;
    ok &= i > 0;
    if (ok && i < seg.size()) {  // an index: name[N]
      ok = seg[i] == '[' && seg.back() == ']' && seg.size() > i + 2 && seg.size() <= i + 8;
      for (size_t j = i + 1; ok && j + 1 < seg.size(); ++j) ok = std::isdigit(static_cast<unsigned char>(seg[j]));
    }
    if (!ok)
      throw UserError(arg + ": malformed key '" + key +
                      "' (expected a dotted key such as train.lr, fp4.block or "
                      "override[0].scale_target)");
    segs.push_back(seg);
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return segs;
}

std::string table_of(const std::string& seg) { return seg.substr(0, seg.find('[')); }

template <size_t N>
bool among(const std::string& s, const char* const (&list)[N]) {
  for (const char* x : list)
    if (s == x) return true;
  return false;
}

template <size_t N>
std::string join(const char* const (&list)[N]) {
  std::string o;
  for (const char* x : list) o += (o.empty() ? "" : ", ") + std::string(x);
  return o;
}
}  // namespace

Settings parse_settings(const std::vector<std::string>& args) {
  Settings out;
  for (const std::string& raw : args) {
    Setting s;
    s.arg = "--set " + raw;
    const size_t eq = raw.find('=');
    if (eq == std::string::npos)
      throw UserError(s.arg + ": expected KEY=VALUE (e.g. --set train.lr=1e-3 or --set fp4.block=32)");
    std::string key = trim(raw.substr(0, eq));
    const std::string text = trim(raw.substr(eq + 1));
    if (key.empty()) throw UserError(s.arg + ": no key before '='");
    if (text.empty())
      throw UserError(s.arg + ": no value after '=' (a TOML value: 32, 1e-3, true, \"e4m3\", [0, 1])");
    bool recipe = false;
    if (key.rfind("recipe.", 0) == 0) {
      recipe = true;
      key = key.substr(7);
    }
    const std::vector<std::string> segs = key_segments(s.arg, key);
    const std::string first = table_of(segs[0]);
    if (recipe) {
      if (!among(first, kRecipeTables) && !among(first, kRecipeTopKeys))
        throw UserError(s.arg + ": unknown recipe table or key '" + first + "' (recipe tables: " +
                        join(kRecipeTables) + "; top-level keys: " + join(kRecipeTopKeys) + ")");
    } else if (among(first, kRecipeTopKeys)) {
      throw UserError(s.arg + ": the recipe's top-level key '" + first + "' is written recipe." +
                      first);
    } else if (among(first, kRecipeTables)) {
      recipe = true;
    } else if (!among(first, kConfigTables)) {
      throw UserError(s.arg + ": unknown table '" + first + "' (run config tables: " +
                      join(kConfigTables) + "; recipe tables: " + join(kRecipeTables) +
                      ", or recipe.name / recipe.description)");
    }
    if (segs.size() == 1 && !among(first, kRecipeTopKeys))
      throw UserError(s.arg + ": '" + key + "' is a table; set one of its keys (e.g. " +
                      (recipe ? "fp4.block" : "train.lr") + ")");
    for (size_t i = 1; i < segs.size(); ++i)
      if (segs[i].find('[') != std::string::npos)
        throw UserError(s.arg + ": malformed key '" + key + "' (an index [N] selects an "
                        "[[override]] table: override[0].scale_target)");
    if (segs[0].find('[') != std::string::npos && first != "override")
      throw UserError(s.arg + ": malformed key '" + key + "' (only [[override]] tables are indexed)");
    if (first == "override" && segs[0].find('[') == std::string::npos)
      throw UserError(s.arg + ": an [[override]] key needs the table's 0-based index, e.g. "
                      "override[0].scale_target");
    s.key = key;

    // The value: one TOML value, or a bare string.
    toml::table t;
    bool parsed = false;
    std::string why;
    try {
      t = toml::parse("v = " + text, std::string_view("--set"));
      parsed = t.size() == 1 && t.contains("v");
      if (!parsed) why = "more than one value";
    } catch (const toml::parse_error& e) {
      why = std::string(e.description());
    }
    if (parsed) {
      s.value = text;
      const toml::node& v = *t.get("v");
      if (v.is_string()) {
        s.label = key + "=" + *v.value<std::string>();
      } else {
        std::string compact;
        for (char c : text)
          if (!std::isspace(static_cast<unsigned char>(c))) compact += c;
        s.label = key + "=" + compact;
      }
    } else if (text[0] == '"' || text[0] == '\'' || text[0] == '[' || text[0] == '{' ||
               text.find('\n') != std::string::npos) {
      throw UserError(s.arg + ": the value is not a valid TOML value (" + why +
                      "); e.g. 32, 1e-3, true, \"e4m3\", [0, 1]");
    } else {
      s.value = detail::toml_quote(text);
      s.label = key + "=" + text;
    }
    for (const auto* list : {&out.config, &out.recipe})
      for (const Setting& p : *list)
        if (p.key == s.key)
          throw UserError(s.arg + ": key '" + s.key + "' is already set by " + p.arg +
                          " (give each key once)");
    (recipe ? out.recipe : out.config).push_back(s);
    out.given.push_back(raw);
  }
  return out;
}

std::string with_settings(const std::string& where, const std::vector<Setting>& sets) {
  if (sets.empty()) return where;
  std::string o = where + " with";
  for (const auto& s : sets) o += " " + s.arg;
  return o;
}

bool names_no_result(const std::string& key) {
  return key == "data.cache" || key == "log.progress_seconds";
}

std::string labelled_name(const std::string& name, const std::vector<Setting>& sets) {
  std::string o = name;
  for (const auto& s : sets)
    if (!names_no_result(s.key)) o += "+" + s.label;
  return o;
}

}  // namespace fp4
