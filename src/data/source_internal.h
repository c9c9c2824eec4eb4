// What the data room's readers share about a source's files (private to the room):
// implemented in corpus.cpp.
#pragma once
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace fp4::detail {

/// Regular files below the directory `root` whose names (and whose directories' names) do not
/// start with '.', as (relative generic path, path), sorted by relative path. Throws
/// fp4::UserError naming `root` if it cannot be read or holds no such file.
std::vector<std::pair<std::string, std::filesystem::path>> list_files(const std::filesystem::path& root);

/// True for the pre-tokenized DataSpec formats: llmc, uint16, uint32.
bool is_token_format(const std::string& format);

}  // namespace fp4::detail
