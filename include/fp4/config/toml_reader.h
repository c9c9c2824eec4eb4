// Strict TOML reading: every key must be known, of the right type and in range; errors
// name the file, the dotted key and what was expected. The reader of run configs (this
// room's config.cpp) and of recipe files (the recipe room's recipe.cpp); TomlReader::apply
// applies the --set settings (fp4/config/settings.h) to either before it is read.
#pragma once
#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/config/settings.h"

namespace fp4::detail {

/// A TOML basic string literal for `s` (quotes, backslashes and control characters escaped).
inline std::string toml_quote(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

/// The shortest decimal that reads back to exactly `v` (std::to_chars), as a TOML number:
/// resolved configs written with it reload bit for bit (checkpoint resume).
template <class T>
inline std::string toml_number(T v) {
  char b[64];
  const auto r = std::to_chars(b, b + sizeof b, v);
  return std::string(b, r.ptr);
}

class TomlReader {
 public:
  struct FromText {};
  /// Parse TOML text; `where` stands for the file name in error messages.
  TomlReader(FromText, const std::string& text, const std::string& where) : file_(where) {
    if (text.empty()) throw UserError(file_ + ": empty TOML text");
    try {
      tbl_ = toml::parse(text, file_);
    } catch (const toml::parse_error& e) {
      std::ostringstream m;
      m << file_ << ":" << e.source().begin.line << ":" << e.source().begin.column
        << ": malformed TOML: " << e.description();
      throw UserError(m.str());
    }
  }

  /// The file name (or the `where` of TOML text) used in error messages, followed by the
  /// --set arguments applied (with_settings).
  const std::string& where() const { return where_.empty() ? file_ : where_; }

  explicit TomlReader(const std::filesystem::path& file) : file_(file.string()) {
    if (!std::filesystem::exists(file)) throw UserError(file_ + ": file not found");
    if (!std::filesystem::is_regular_file(file))
      throw UserError(file_ + ": not a regular file (expected a TOML file)");
    if (std::filesystem::file_size(file) == 0) throw UserError(file_ + ": empty file");
    try {
      tbl_ = toml::parse_file(file_);
    } catch (const toml::parse_error& e) {
      std::ostringstream m;
      m << file_ << ":" << e.source().begin.line << ":" << e.source().begin.column
        << ": malformed TOML: " << e.description();
      throw UserError(m.str());
    }
  }

  /// Same as where(): the source named by cross-key errors.
  const std::string& file() const { return where(); }

  /// Apply `--set` overrides (fp4/config/settings.h) to the parsed file, before any get(): each
  /// key's value is replaced (or added) with the setting's TOML value, creating its table if
  /// the file lacks it; an index `name[N]` must name an existing table of the array of tables
  /// `name`. Later errors about an overridden key name its --set argument instead of the file.
  /// Throws fp4::UserError naming the argument when a key runs into a value that is not a
  /// table, names a whole table, or indexes a missing [[table]].
  void apply(const std::vector<Setting>& sets) {
    for (const Setting& s : sets) {
      toml::table parsed = toml::parse("v = " + s.value, std::string_view("--set"));
      toml::table* t = &tbl_;
      std::string path;
      size_t pos = 0;
      while (true) {
        const size_t dot = s.key.find('.', pos);
        const bool last = dot == std::string::npos;
        const std::string seg = s.key.substr(pos, last ? std::string::npos : dot - pos);
        path += (path.empty() ? "" : ".") + seg;
        if (last) {
          if (toml::node* old = t->get(seg); old && (old->is_table() || old->is_array_of_tables()))
            throw UserError(s.arg + ": '" + path + "' is a table in " + file_ +
                            "; set one of its keys");
          t->insert_or_assign(seg, std::move(*parsed.get("v")));
          break;
        }
        const size_t br = seg.find('[');
        if (br != std::string::npos) {
          const std::string name = seg.substr(0, br);
          const size_t idx = std::stoul(seg.substr(br + 1));
          toml::array* arr = t->get_as<toml::array>(name);
          const size_t n = arr && arr->is_array_of_tables() ? arr->size() : 0;
          if (idx >= n)
            throw UserError(s.arg + ": " + file_ + " has " + std::to_string(n) + " [[" + name +
                            "]] table" + (n == 1 ? "" : "s") +
                            (n ? " (0.." + std::to_string(n - 1) + ")" : "") +
                            "; --set changes keys of existing ones only");
          t = arr->get(idx)->as_table();
        } else {
          toml::node* sub = t->get(seg);
          if (!sub) {
            t->insert(seg, toml::table{});
            sub = t->get(seg);
          }
          if (!sub->is_table())
            throw UserError(s.arg + ": '" + path + "' is not a table in " + file_);
          t = sub->as_table();
        }
        pos = dot + 1;
      }
      origin_[s.key] = s.arg;
    }
    where_ = with_settings(file_, sets);
  }

  /// Whether `key`'s value comes from a --set setting rather than the file.
  bool from_setting(const std::string& key) const { return origin_.count(key) > 0; }

  /// Whether the (merged) table has `key` (marks it seen).
  bool has(const std::string& key) {
    seen_.insert(key);
    return static_cast<bool>(tbl_.at_path(key));
  }

  template <class T>
  void get(const std::string& key, T& out) {
    seen_.insert(key);
    auto node = tbl_.at_path(key);
    if (!node) return;
    if constexpr (std::is_same_v<T, bool>) {
      if (!node.is_boolean()) fail(key, "a boolean (true/false)");
      out = *node.value<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      if (!node.is_integer()) fail(key, "an integer");
      const int64_t v = *node.value<int64_t>();
      if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          (std::numeric_limits<T>::max() < std::numeric_limits<int64_t>::max() &&
           v > static_cast<int64_t>(std::numeric_limits<T>::max())))
        fail(key, "an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                      std::to_string(std::numeric_limits<T>::max()) + "], got " + std::to_string(v));
      out = static_cast<T>(v);
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!node.is_number()) fail(key, "a number");
      out = static_cast<T>(*node.value<double>());
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!node.is_string()) fail(key, "a string");
      out = *node.value<std::string>();
    } else if constexpr (std::is_same_v<T, std::vector<int>>) {
      auto* arr = node.as_array();
      if (!arr) fail(key, "an array of integers");
      out.clear();
      for (auto& e : *arr) {
        if (!e.is_integer()) fail(key, "an array of integers");
        const int64_t v = *e.value<int64_t>();
        if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
          fail(key, "an array of integers in int range, got " + std::to_string(v));
        out.push_back(static_cast<int>(v));
      }
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      auto* arr = node.as_array();
      if (!arr) fail(key, "an array of strings");
      out.clear();
      for (auto& e : *arr) {
        if (!e.is_string()) fail(key, "an array of strings");
        out.push_back(*e.value<std::string>());
      }
    }
  }

  /// Whether `key` is present in the file (does not mark it as read).
  bool has(const std::string& key) const { return bool(tbl_.at_path(key)); }

  /// Whether `key` is present and holds a TOML integer, not a float (`250`, not `250.0`), for
  /// keys whose meaning depends on which (train.final_window). Does not mark it as read.
  bool is_integer(const std::string& key) const {
    const auto node = tbl_.at_path(key);
    return node && node.is_integer();
  }

  /// Number of tables in the array of tables `key` ([[key]] sections), 0 if absent. Throws
  /// fp4::UserError naming the key if it is present but not an array of tables.
  size_t table_array_size(const std::string& key) {
    seen_.insert(key);
    auto node = tbl_.at_path(key);
    if (!node) return 0;
    auto* arr = node.as_array();
    if (!arr || !arr->is_array_of_tables())
      fail(key, "an array of tables ([[" + key + "]] sections)");
    return arr->size();
  }

  template <class T>
  void range(const std::string& key, T v, T lo, T hi) {
    if (!(v >= lo && v <= hi)) {
      std::ostringstream m;
      m << "a value in [" << lo << ", " << hi << "], got " << v;
      fail(key, m.str());
    }
  }

  void choice(const std::string& key, const std::string& v, std::initializer_list<const char*> ok) {
    for (auto* o : ok)
      if (v == o) return;
    std::string list;
    for (auto* o : ok) list += std::string(list.empty() ? "" : ", ") + "\"" + o + "\"";
    fail(key, "one of " + list + ", got \"" + v + "\"");
  }

  /// After all get() calls: every key in the file must have been read.
  void reject_unknown() const { walk(tbl_, ""); }

  [[noreturn]] void fail(const std::string& key, const std::string& expected) const {
    throw UserError(source_of(key) + ": key '" + key + "': expected " + expected);
  }

 private:
  void walk(const toml::table& t, const std::string& prefix) const {
    for (auto&& [k, v] : t) {
      const std::string full = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      if (auto* sub = v.as_table()) {
        bool any = false;
        for (auto& s : seen_)
          if (s.rfind(full + ".", 0) == 0) any = true;
        if (!any) {
          std::string src = file_;
          for (const auto& [k, arg] : origin_)
            if (k.rfind(full + ".", 0) == 0) src = arg;
          throw UserError(src + ": unknown section [" + full + "]");
        }
        walk(*sub, full);
      } else if (auto* arr = v.as_array(); arr && arr->is_array_of_tables() && seen_.count(full)) {
        // [[full]] sections: every key of every table must have been read.
        for (size_t i = 0; i < arr->size(); ++i)
          walk(*arr->get(i)->as_table(), full + "[" + std::to_string(i) + "]");
      } else if (!seen_.count(full)) {
        throw UserError(source_of(full) + ": unknown key '" + full + "'" + known_keys(prefix));
      }
    }
  }

  // The --set argument that gave `key`, else the file.
  const std::string& source_of(const std::string& key) const {
    const auto it = origin_.find(key);
    return it == origin_.end() ? file_ : it->second;
  }

  // " (keys of [table]: a, b, c)" from the keys read, or "" when none (top level, arrays).
  std::string known_keys(const std::string& table) const {
    std::string list;
    const std::string p = table.empty() ? "" : table + ".";
    for (const std::string& k : seen_) {
      if (k.rfind(p, 0) != 0) continue;
      const std::string rest = k.substr(p.size());
      if (rest.find('.') != std::string::npos || rest.find('[') != std::string::npos) continue;
      list += (list.empty() ? "" : ", ") + rest;
    }
    if (list.empty()) return "";
    return " (" + (table.empty() ? std::string("top-level keys") : "keys of [" + table + "]") +
           ": " + list + ")";
  }

  std::string file_;
  std::string where_;                          // file_ with the --set arguments, once applied
  std::map<std::string, std::string> origin_;  // key -> the --set argument that set it
  toml::table tbl_;
  std::set<std::string> seen_;
};

}  // namespace fp4::detail
