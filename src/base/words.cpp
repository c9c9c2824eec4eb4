// Directory names, shell words, counted nouns and durations (fp4/base/words.h).
#include "fp4/base/words.h"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace fp4 {

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

std::string count_of(long long n, const std::string& singular, const std::string& plural) {
  return std::to_string(n) + " " +
         (n == 1 ? singular : plural.empty() ? singular + "s" : plural);
}

std::string duration_words(double seconds) {
  constexpr double kMaxDays = 99999;
  if (seconds < 0 || !std::isfinite(seconds)) return "?";
  if (seconds >= kMaxDays * 86400) return "> 99999d";
  const auto t = static_cast<long long>(seconds + 0.5);
  char b[32];
  if (t >= 86400)
    std::snprintf(b, sizeof b, "%lldd%02lldh", t / 86400, (t / 3600) % 24);
  else if (t >= 3600)
    std::snprintf(b, sizeof b, "%lldh%02lldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(b, sizeof b, "%lldm%02llds", t / 60, t % 60);
  else
    std::snprintf(b, sizeof b, "%llds", t);
  return b;
}

}  // namespace fp4
