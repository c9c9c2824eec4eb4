// The safetensors container shared by QTensor files and training checkpoints, and durable
// atomic file writes. Layout (https://github.com/huggingface/safetensors, "Format"): an
// 8-byte little-endian header length N, N bytes of JSON
//   {"<tensor>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string>", ...}}
// then the tensors' raw little-endian bytes (offsets relative to the end of the header).
#pragma once
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "fp4/base/error.h"

namespace fp4 {

/// A file could not be written (write, fsync, close or rename failed: a full disk, an I/O
/// error), with a message naming the file and the system's reason; thrown by AtomicFile,
/// AppendFile and fsync_file. A UserError, so code that reports those reports it too; the
/// CLI exits with status 1 for it (a failure, not a bad argument: docs/cli.md "Exit codes").
struct IoError : UserError {
  using UserError::UserError;
};

/// A file written to `<file>.tmp` in the same directory and moved over `file` by commit():
/// fsync of the data, rename, fsync of the directory, so after a crash (SIGKILL, power loss)
/// `file` holds either its old or its complete new content. If commit() is never reached
/// the temporary file is removed. Errors throw fp4::UserError naming the file (fp4::IoError
/// when a write, fsync, close or rename fails).
class AtomicFile {
 public:
  explicit AtomicFile(const std::filesystem::path& file);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t bytes);
  void commit();

 private:
  std::filesystem::path file_, tmp_;
  int fd_ = -1;
  int kind_ = 0;            // test hooks: checkpoint or file
  uint64_t index_ = 0;      // test hooks: this write's 1-based number of its kind
  uint64_t written_ = 0;    // bytes written so far
};

/// An append-only file (metrics.jsonl): append() writes one whole record through one file
/// descriptor (O_APPEND), sync() makes everything appended so far durable (fsync of the data
/// and of the directory). A record that cannot be written completely (ENOSPC, EIO) is cut off
/// again (ftruncate to the size before it, best effort) and throws, so the file keeps whole
/// records only; a SIGKILL in the middle of append() can still leave a partial last record
/// (a reader must drop an incomplete last line). A failed open throws fp4::UserError, a failed
/// write or fsync fp4::IoError, each naming the file and the system's reason; append() or
/// sync() before open() throws std::logic_error.
class AppendFile {
 public:
  AppendFile() = default;
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  /// Open (creating it) `file` for appending; `truncate`: empty it first.
  void open(const std::filesystem::path& file, bool truncate);
  bool is_open() const { return fd_ >= 0; }
  void append(std::string_view record);
  void sync();

 private:
  std::filesystem::path file_;
  int fd_ = -1;
};

/// Test hooks of the durable writers (AtomicFile, AppendFile), for the crash-consistency
/// campaign tests/crash/kill_campaign.sh (docs/robustness.md "Crash consistency"). Compiled in
/// always; inert unless an environment variable below is set (read at the first write):
///   FP4_TEST_KILL_AT=KIND:N:K     during the N-th (1-based, counted in this process) write of
///       KIND, once K bytes of it are written, the process sends itself SIGKILL. KIND is
///       `checkpoint` (an AtomicFile of a *.safetensors file), `file` (any other AtomicFile:
///       config.toml, summary.json, the metrics.jsonl rewrite of a resume, ...) or `metrics`
///       (one AppendFile::append, i.e. one metrics.jsonl line). K is a byte count, `end` (after
///       the last byte, before AtomicFile::commit's fsync and rename) or `after` (after the
///       commit: the file complete and in place, before commit() returns); a count equal to
///       the write's size acts as `end`, one past it as `after`. For an AppendFile record
///       `end` and `after` both kill before append() returns.
///   FP4_TEST_FAIL_WRITE_AFTER=B   once B bytes in total have been written by AtomicFile and
///       AppendFile in this process, write(2) fails with ENOSPC (after a short write up to
///       B), as on a full disk.
/// A malformed value throws fp4::UserError naming the variable.

/// Replace `file` by `bytes` with AtomicFile.
void write_file_atomic(const std::filesystem::path& file, std::string_view bytes);

/// fsync(2) the data of an existing file written through another handle (e.g. the
/// std::ofstream of metrics.jsonl, after its flush) and of its directory, so that it
/// survives a power cut. Throws fp4::UserError naming the file if it cannot be opened,
/// fp4::IoError if fsync fails.
void fsync_file(const std::filesystem::path& file);

/// 64-bit FNV-1a hash of bytes [data, data + n), continuing from `h` (start with
/// kFnvOffset). Used as a corruption check, not as a cryptographic hash.
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnvOffset);

namespace safetensors {

/// One tensor to write: `bytes` raw little-endian bytes of `dtype` ("F32", "F64", "U8",
/// "I64", ...) forming `shape`.
struct TensorOut {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t bytes = 0;
};

/// Bytes per element of a safetensors dtype name (BOOL, U8, I8, F8_*, U16, I16, F16, BF16,
/// U32, I32, F32, U64, I64, F64); 0 if unknown.
size_t dtype_size(const std::string& dtype);

/// The JSON header for `tensors` stored back to back in the given order, with `metadata`
/// (an object of strings; omitted if empty). Throws std::invalid_argument if a tensor's
/// byte count disagrees with its dtype and shape.
nlohmann::json make_header(const std::vector<TensorOut>& tensors, const nlohmann::json& metadata);

/// Write `header` (from make_header, possibly with metadata added) and the tensors' bytes to
/// `file` atomically (AtomicFile). The header is padded with spaces so the data starts at a
/// multiple of 8 bytes. Throws fp4::UserError if the file cannot be written.
void write_file(const std::filesystem::path& file, const nlohmann::json& header,
                const std::vector<TensorOut>& tensors);

/// The first part of the file write_file writes: the 8-byte little-endian length and the
/// header's JSON text (nlohmann's compact dump, keys sorted), padded with spaces so the data
/// starts at a multiple of 8 bytes.
std::string header_bytes(const nlohmann::json& header);

/// The whole file write_file writes, in memory: header_bytes(header) then the tensors' bytes
/// in order (for tests, the fuzz targets' round-trip checks and small files).
std::string to_bytes(const nlohmann::json& header, const std::vector<TensorOut>& tensors);

/// A safetensors file read into memory, with checked access to its parts. Every error is an
/// fp4::UserError "<file>: not a valid <kind> safetensors file: <what>".
class File {
 public:
  /// Read and parse `file`: throws (see above) if it cannot be opened ("cannot open"), is
  /// shorter than 8 bytes, its header length exceeds the file, or the header is not a JSON
  /// object.
  File(const std::filesystem::path& file, std::string kind);

  /// Parse a safetensors file already in memory, `bytes` (the same checks as the constructor
  /// from a file, which reads the file and calls this); `name` names it in errors.
  static File from_bytes(std::string_view bytes, std::string name, std::string kind);

  const nlohmann::json& header() const { return header_; }
  const std::vector<uint8_t>& data() const { return data_; }  ///< bytes after the header
  const std::string& name() const { return name_; }

  /// The error to throw for this file: "<file>: not a valid <kind> safetensors file: <what>".
  UserError error(const std::string& what) const;

  /// Bytes of tensor `name`: it must exist, have dtype `dtype`, data_offsets [b, e] with
  /// b <= e <= data().size() (else "... lies outside the file (truncated?)"), and a shape of
  /// non-negative integers whose element count × dtype size is e − b.
  std::span<const uint8_t> tensor(const std::string& name, const std::string& dtype) const;

  /// "__metadata__"[key] as a string; throws if the metadata or the key is missing or not a string.
  std::string meta(const std::string& key) const;

 private:
  File(std::string name, std::string kind) : name_(std::move(name)), kind_(std::move(kind)) {}
  // The checked header length of a file of `size` bytes whose first bytes are `first8`.
  uint64_t header_length(std::string_view first8, uint64_t size) const;
  void parse_header(std::string_view text);  // the JSON object of the header

  std::string name_, kind_;
  nlohmann::json header_;
  std::vector<uint8_t> data_;
};

}  // namespace safetensors
}  // namespace fp4
