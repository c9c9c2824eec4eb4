// Strict TOML reading: every key must be known, of the right type and in range; errors
// name the file, the dotted key and what was expected.
#pragma once
#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fp4/error.h"

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

  /// The file name (or the `where` of TOML text) used in error messages.
  const std::string& where() const { return file_; }

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

  const std::string& file() const { return file_; }

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
    throw UserError(file_ + ": key '" + key + "': expected " + expected);
  }

 private:
  void walk(const toml::table& t, const std::string& prefix) const {
    for (auto&& [k, v] : t) {
      const std::string full = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      if (auto* sub = v.as_table()) {
        bool any = false;
        for (auto& s : seen_)
          if (s.rfind(full + ".", 0) == 0) any = true;
        if (!any) throw UserError(file_ + ": unknown section [" + full + "]");
        walk(*sub, full);
      } else if (auto* arr = v.as_array(); arr && arr->is_array_of_tables() && seen_.count(full)) {
        // [[full]] sections: every key of every table must have been read.
        for (size_t i = 0; i < arr->size(); ++i)
          walk(*arr->get(i)->as_table(), full + "[" + std::to_string(i) + "]");
      } else if (!seen_.count(full)) {
        throw UserError(file_ + ": unknown key '" + full + "'");
      }
    }
  }

  std::string file_;
  toml::table tbl_;
  std::set<std::string> seen_;
};

}  // namespace fp4::detail
