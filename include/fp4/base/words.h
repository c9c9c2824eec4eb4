// Names that leave the program: a run's directory name and a word of a shell command that a
// message prints for the user to run.
#pragma once
#include <string>

namespace fp4 {

/// `name` as one directory name: characters outside [A-Za-z0-9._+=,-] become '_', and a
/// leading '.' (or an empty name) gets a '_' before it. Throws nothing but std::bad_alloc.
std::string dir_safe(const std::string& name);

/// `s` as one shell word: unchanged if it has only [A-Za-z0-9._+=,/:@%-], else single-quoted
/// (a quote inside as '\''). Throws nothing but std::bad_alloc.
std::string shell_word(const std::string& s);

}  // namespace fp4
