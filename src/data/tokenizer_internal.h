// SentencePiece training, shared by tokenizer.cpp (which owns SentencePiece) and
// token_cache.cpp (which builds the cache). Private to the data room.
#pragma once
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>

namespace fp4::detail {

/// Every option that changes the tokenizer of `vocab_size` pieces; part of the cache key
/// (max_train_bytes and seed are ours, the others SentencePiece's).
std::unordered_map<std::string, std::string> trainer_options(int vocab_size);
/// The options as "k=v;" pairs sorted by key.
std::string options_string(const std::unordered_map<std::string, std::string>& opts);

/// Appends the non-blank lines of `doc` (CR stripped, lines over 8192 bytes cut at a space)
/// to `out`, one per line, keeping only those whose running index `line_no` is a multiple of
/// `stride`; `line_no` counts the non-blank lines over all documents.
void append_training_lines(std::string_view doc, size_t stride, size_t& line_no, std::string& out);
/// The line stride that keeps a training split of `train_bytes` near kMaxTokenizerTrainBytes:
/// ceil(train_bytes / cap), 1 at or below it.
size_t training_stride(size_t train_bytes);

/// Trains the BPE tokenizer on the text file `input` (one sentence per line), writing
/// `model_prefix`.model and .vocab. Throws fp4::UserError naming `data_path` if SentencePiece
/// fails or finds fewer than vocab_size pieces.
void train_tokenizer(const std::filesystem::path& input, const std::filesystem::path& model_prefix,
                     int vocab_size, const std::filesystem::path& data_path);

}  // namespace fp4::detail
