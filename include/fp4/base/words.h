// Words that leave the program: a run's directory name, a word of a shell command that a
// message prints for the user to run, a count with its noun ("1 step", "3 steps") and a
// duration ("3m05s").
#pragma once
#include <string>

namespace fp4 {

/// `name` as one directory name: characters outside [A-Za-z0-9._+=,-] become '_', and a
/// leading '.' (or an empty name) gets a '_' before it. Throws nothing but std::bad_alloc.
std::string dir_safe(const std::string& name);

/// `s` as one shell word: unchanged if it has only [A-Za-z0-9._+=,/:@%-], else single-quoted
/// (a quote inside as '\''). Throws nothing but std::bad_alloc.
std::string shell_word(const std::string& s);

/// `n` followed by `singular` when n is 1, else by `plural` (by default `singular` + "s"):
/// count_of(1, "step") is "1 step", count_of(0, "step") "0 steps", count_of(2, "batch",
/// "batches") "2 batches". Throws nothing but std::bad_alloc.
std::string count_of(long long n, const std::string& singular, const std::string& plural = "");

/// A duration of `seconds` as progress lines print it (an ETA): "42s", "3m05s", "2h07m",
/// "12d03h"; "?" when unknown (negative or not finite) and "> 99999d" from 99999 days on, so
/// no step count can overflow it into a negative figure. Throws nothing but std::bad_alloc.
std::string duration_words(double seconds);

}  // namespace fp4
