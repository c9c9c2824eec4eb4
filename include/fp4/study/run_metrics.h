// The metrics log of a finished run, plain or compacted: a run directory holds
// metrics.jsonl (what fp4::train writes and a resume cuts) or, once `fp4train compact` has
// compressed it, metrics.jsonl.zst (one zstd stream of the same bytes, with its checksum).
// `report` and the plots read either; see docs/compare.md "Compacted runs".
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

namespace fp4 {

/// The metrics file of run directory `dir`: dir/metrics.jsonl, else dir/metrics.jsonl.zst.
/// Throws fp4::UserError naming the files when `dir` holds both (an interrupted compaction,
/// or a log decompressed beside its archive: `fp4train compact DIR` settles it from the
/// plain one) or neither ("cannot read DIR/metrics.jsonl").
std::filesystem::path run_metrics_file(const std::filesystem::path& dir);

/// Reads a metrics file line by line, streaming: a plain file as std::getline reads it, a
/// file whose name ends in ".zst" decompressed as it goes (zstd frames, concatenated frames
/// allowed). Memory: one line plus about 256 KiB of buffers.
class MetricsReader {
 public:
  /// Opens `file`; throws fp4::UserError "cannot read FILE" when it cannot be opened.
  explicit MetricsReader(const std::filesystem::path& file);
  ~MetricsReader();
  MetricsReader(const MetricsReader&) = delete;
  MetricsReader& operator=(const MetricsReader&) = delete;
  /// The next line into `line`, without its '\n' (a last line without one is returned as
  /// it is); false at the end of the file. Throws fp4::UserError naming the file when the
  /// zstd data is corrupt (bad frame, checksum mismatch), truncated (the file ends inside a
  /// frame) or empty, or on a read error.
  bool next(std::string& line);
  const std::filesystem::path& file() const { return file_; }

 private:
  struct Zstd;
  std::filesystem::path file_;
  std::ifstream in_;
  std::unique_ptr<Zstd> z_;  // null for a plain file
};

/// What compact_run_metrics did to one run directory.
struct CompactResult {
  std::filesystem::path file;  ///< the run's metrics.jsonl.zst
  uint64_t plain_bytes = 0;    ///< size of the log, uncompressed
  uint64_t compact_bytes = 0;  ///< size of metrics.jsonl.zst
  bool already = false;        ///< the run was compacted before: nothing changed
};

/// Compact the finished run `dir`: compress dir/metrics.jsonl with zstd at `level` (1..22;
/// 19 by default) and content checksum into dir/metrics.jsonl.zst (written atomically),
/// check that it decompresses to the same bytes, then remove metrics.jsonl. A run holding
/// both (a compaction cut off before the removal) is compacted again from the plain file.
/// A run holding only metrics.jsonl.zst is checked (decompressed through) and left as it is
/// (CompactResult::already). The whole log is held in memory while it is compressed.
/// Throws fp4::UserError, changing nothing, when `dir` is not a finished run (summary.json
/// with status "completed", or the error.txt of a divergence; a failed run is not a result
/// and is trained again by `compare`), when another process holds its .fp4train.lock (a
/// training in progress; the lock is held here until the end), when it has no metrics log,
/// or when level is out of range; fp4::IoError when a write fails.
CompactResult compact_run_metrics(const std::filesystem::path& dir, int level = 19);

}  // namespace fp4
