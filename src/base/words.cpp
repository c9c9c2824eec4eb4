// Directory names and shell words (fp4/base/words.h).
#include "fp4/base/words.h"

#include <cctype>

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

}  // namespace fp4
