// The metrics log of a finished run, plain or zstd-compacted (fp4/study/run_metrics.h).
#include "fp4/study/run_metrics.h"

#include "fp4/train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"
#include "fp4/train/metrics_log.h"

namespace fp4 {
namespace fs = std::filesystem;

fs::path run_metrics_file(const fs::path& dir) {
  const fs::path plain = dir / kMetricsFile, packed = dir / kCompactMetricsFile;
  const bool has_plain = fs::exists(plain), has_packed = fs::exists(packed);
  if (has_plain && has_packed)
    throw UserError(dir.string() + " holds both " + kMetricsFile + " and " + kCompactMetricsFile +
                    " (a compaction cut off, or a log decompressed beside its archive); run "
                    "`fp4train compact " + dir.string() + "` to keep the compressed copy of " +
                    kMetricsFile + ", or remove one of them");
  if (has_packed) return packed;
  if (!has_plain) throw UserError("cannot read " + plain.string() + " (nor " + packed.string() + ")");
  return plain;
}

// The decompression state of a .zst file: the stream, its input buffer and the decoded
// bytes not yet returned as lines.
struct MetricsReader::Zstd {
  ZSTD_DCtx* dctx = nullptr;
  std::vector<char> in;
  ZSTD_inBuffer ib{nullptr, 0, 0};
  std::string out;        // decoded bytes; out[pos..] not yet returned
  size_t pos = 0;
  size_t frame_left = 0;  // ZSTD_decompressStream's last hint: 0 when a frame just ended
  bool out_full = false;  // the last call filled its output: more may be pending inside
  bool any_input = false;
  bool eof = false;       // the file is read to its end and every byte decoded
  ~Zstd() { ZSTD_freeDCtx(dctx); }
};

MetricsReader::MetricsReader(const fs::path& file) : file_(file) {
  in_.open(file, std::ios::binary);
  if (!in_) throw UserError("cannot read " + file.string());
  if (file.extension() == ".zst") {
    z_ = std::make_unique<Zstd>();
    z_->dctx = ZSTD_createDCtx();
    if (!z_->dctx) throw UserError(file.string() + ": cannot allocate a zstd decompressor");
    z_->in.resize(ZSTD_DStreamInSize());
  }
}

MetricsReader::~MetricsReader() = default;

bool MetricsReader::next(std::string& line) {
  if (!z_) {
    if (std::getline(in_, line)) return true;
    if (in_.bad()) throw UserError("read error in " + file_.string());
    return false;
  }
  Zstd& z = *z_;
  for (;;) {
    const size_t nl = z.out.find('\n', z.pos);
    if (nl != std::string::npos) {
      line.assign(z.out, z.pos, nl - z.pos);
      z.pos = nl + 1;
      return true;
    }
    if (z.eof) {
      if (z.pos == z.out.size()) return false;
      line.assign(z.out, z.pos, std::string::npos);  // a last line without '\n'
      z.pos = z.out.size();
      return true;
    }
    // Decode more: keep the unfinished line, append what the next input gives.
    z.out.erase(0, z.pos);
    z.pos = 0;
    if (z.ib.pos == z.ib.size && !z.out_full) {
      in_.read(z.in.data(), static_cast<std::streamsize>(z.in.size()));
      if (in_.bad()) throw UserError("read error in " + file_.string());
      const size_t got = static_cast<size_t>(in_.gcount());
      if (got == 0) {
        if (!z.any_input)
          throw UserError(file_.string() + " is empty (no zstd frame); it should hold the run's "
                          "compressed metrics.jsonl");
        if (z.frame_left != 0)
          throw UserError(file_.string() + ": truncated zstd data (the file ends inside a "
                          "frame); the compressed metrics log is incomplete");
        z.eof = true;
        continue;
      }
      z.any_input = true;
      z.ib = ZSTD_inBuffer{z.in.data(), got, 0};
    }
    const size_t chunk = ZSTD_DStreamOutSize();
    const size_t old = z.out.size();
    z.out.resize(old + chunk);
    ZSTD_outBuffer ob{z.out.data() + old, chunk, 0};
    const size_t r = ZSTD_decompressStream(z.dctx, &ob, &z.ib);
    z.out.resize(old + ob.pos);
    z.out_full = ob.pos == chunk;
    if (ZSTD_isError(r))
      throw UserError(file_.string() + ": corrupt zstd data (" + ZSTD_getErrorName(r) +
                      "); the compressed metrics log cannot be read");
    z.frame_left = r;
  }
}

namespace {
std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw UserError("cannot read " + p.string());
  std::ostringstream o;
  o << f.rdbuf();
  if (f.bad()) throw UserError("read error in " + p.string());
  return o.str();
}


// Throws unless `dir` is a finished run: a completed summary or a divergence's error.txt.
void check_finished(const fs::path& dir) {
  const fs::path sp = dir / "summary.json";
  if (fs::exists(sp)) {
    std::ifstream f(sp);
    const nlohmann::json s = nlohmann::json::parse(f, nullptr, false);
    if (s.is_discarded() || !s.is_object() || s.value("status", "") != "completed")
      throw UserError(sp.string() + ": not a completed run's summary (status is not "
                      "\"completed\"); nothing was compacted");
    return;
  }
  std::string first;
  switch (run_error(dir, &first)) {
    case RunError::Diverged:
      return;
    case RunError::Failed:
      throw UserError(dir.string() + " failed (" + (dir / "error.txt").string() + ": " + first +
                      "): not a result, `compare` trains it again; nothing was compacted");
    case RunError::None:
      break;
  }
  throw UserError(dir.string() + " holds no summary.json and no error.txt: the run has not "
                  "finished (still training, or stopped: resume it first); nothing was compacted");
}
}  // namespace

CompactResult compact_run_metrics(const fs::path& dir, int level) {
  if (level < 1 || level > ZSTD_maxCLevel())
    throw UserError("zstd level " + std::to_string(level) + " is out of range 1.." +
                    std::to_string(ZSTD_maxCLevel()));
  if (!fs::is_directory(dir)) throw UserError(dir.string() + " is not a directory");
  check_finished(dir);
  // The run's lock (fp4::train holds it while it trains into the directory); a directory
  // without a lock file never had a run of this version and gets none.
  const RunDirLock lock(dir, "compact it once that has finished (nothing was changed)", /*create=*/false);
  const fs::path plain = dir / kMetricsFile, packed = dir / kCompactMetricsFile;
  CompactResult res;
  res.file = packed;
  if (!fs::exists(plain)) {
    if (!fs::exists(packed))
      throw UserError(dir.string() + " holds no " + kMetricsFile + " (nor " + kCompactMetricsFile +
                      "); nothing was compacted");
    // Compacted before: read it through, so that a damaged archive is found now.
    MetricsReader r(packed);
    std::string line;
    while (r.next(line)) res.plain_bytes += line.size() + 1;
    res.compact_bytes = fs::file_size(packed);
    res.already = true;
    return res;
  }
  const std::string text = read_bytes(plain);
  std::string z(ZSTD_compressBound(text.size()), '\0');
  {
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    if (!cctx) throw UserError("cannot allocate a zstd compressor");
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    const size_t n = ZSTD_compress2(cctx, z.data(), z.size(), text.data(), text.size());
    ZSTD_freeCCtx(cctx);
    if (ZSTD_isError(n))
      throw UserError(plain.string() + ": zstd compression failed (" + ZSTD_getErrorName(n) + ")");
    z.resize(n);
  }
  // The archive must give back the log byte for byte before the log goes.
  {
    std::string back(text.size(), '\0');
    const size_t n = ZSTD_decompress(back.data(), back.size(), z.data(), z.size());
    if (ZSTD_isError(n) || n != text.size() || back != text)
      throw UserError(plain.string() + ": its zstd compression does not decompress to the same "
                      "bytes; nothing was changed");
  }
  write_file_atomic(packed, z);
  if (read_bytes(packed) != z)
    throw IoError(packed.string() + " does not hold what was written; " + plain.string() +
                  " is kept");
  std::error_code ec;
  if (!fs::remove(plain, ec) || ec)
    throw IoError("cannot remove " + plain.string() + " after writing " + packed.string() + ": " +
                  ec.message());
  res.plain_bytes = text.size();
  res.compact_bytes = z.size();
  return res;
}

}  // namespace fp4
