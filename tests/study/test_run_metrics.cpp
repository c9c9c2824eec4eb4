// Compacted metrics logs (docs/compare.md "Compacted runs", fp4/study/run_metrics.h): a run
// whose metrics.jsonl is replaced by metrics.jsonl.zst reads back exactly as its plain twin; a
// damaged archive is refused with the file named; compaction refuses runs that are not finished
// or are in use.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <zstd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/study/report.h"
#include "fp4/study/run_metrics.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {
// A fresh temporary directory, removed at the end of the test.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("fp4_runmetrics_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream o;
  o << f.rdbuf();
  return o.str();
}
void write_bytes(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}

// zstd of `text` at `level`, made here with libzstd itself (not with the code under test).
std::string zstd_of(const std::string& text, int level = 3) {
  std::string z(ZSTD_compressBound(text.size()), '\0');
  const size_t n = ZSTD_compress(z.data(), z.size(), text.data(), text.size(), level);
  EXPECT_FALSE(ZSTD_isError(n));
  z.resize(n);
  return z;
}

// A metrics log of `steps` lines of the shape fp4::train writes, with a telemetry blob on
// some lines so that the decoded text spans many of the reader's output chunks.
std::string metrics_text(int steps) {
  std::string t;
  for (int s = 1; s <= steps; ++s) {
    char b[200];
    std::snprintf(b, sizeof b, "{\"grad_norm\":%.17g,\"loss\":%.17g,\"lr\":0.002,\"step\":%d,\"step_ms\":%.3f",
                  0.5 + 1.0 / s, 8.0 - 0.01 * s + 1e-3 * (s % 7), s, 40.0 + (s % 13));
    t += b;
    if (s % 10 == 0) {
      t += ",\"scale_hist\":[";
      for (int i = 0; i < 2000; ++i) t += (i ? "," : "") + std::to_string((i * 7919 + s) % 100003);
      t += "]";
    }
    t += "}\n";
  }
  return t;
}

// A completed run directory with metrics log `text` (plain).
void write_run(const fs::path& d, const std::string& text) {
  fs::create_directories(d);
  std::ofstream(d / "summary.json") << R"({"status":"completed","recipe":"fp32","seed":1,"steps":400,
    "final_window_loss":5.5,"tokens_per_s":10,"heldout_nll":5.6,"heldout_nll_quant":5.6})";
  write_bytes(d / "metrics.jsonl", text);
}

std::vector<std::string> lines_of(const fs::path& f) {
  MetricsReader r(f);
  std::vector<std::string> out;
  std::string line;
  while (r.next(line)) out.push_back(line);
  return out;
}

// What std::getline gives for `text`: the plain reader's behaviour, which the zstd one
// must repeat.
std::vector<std::string> getline_lines(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(RunMetrics, ACompactedRunReadsAsItsPlainTwin) {
  TempDir t("twin");
  const std::string text = metrics_text(400);
  ASSERT_GT(text.size(), 3 * ZSTD_DStreamOutSize());  // many output chunks
  write_run(t.path / "plain", text);
  write_run(t.path / "packed", text);
  fs::remove(t.path / "packed" / "metrics.jsonl");
  write_bytes(t.path / "packed" / "metrics.jsonl.zst", zstd_of(text, 19));
  EXPECT_EQ(run_metrics_file(t.path / "packed"), t.path / "packed" / "metrics.jsonl.zst");
  EXPECT_EQ(run_metrics_file(t.path / "plain"), t.path / "plain" / "metrics.jsonl");
  const RunRecord a = read_run(t.path / "plain"), b = read_run(t.path / "packed");
  ASSERT_EQ(a.step.size(), 400u);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.grad_norm, b.grad_norm);
  EXPECT_EQ(a.step_ms, b.step_ms);
  // The report built from each is the same text (the directories' names aside).
  RunRecord b2 = b;
  b2.dir = a.dir;
  EXPECT_EQ(comparison_report_md(aggregate_runs({a}, {"fp32"}), {a}, ReportContext{}),
            comparison_report_md(aggregate_runs({b2}, {"fp32"}), {b2}, ReportContext{}));
}

TEST(RunMetrics, LinesAreThoseOfGetline) {
  TempDir t("lines");
  // Empty lines, a CR, a last line without '\n', and two frames concatenated (zstd allows it).
  for (const std::string& text :
       {std::string("a\n\nb\r\nc"), std::string("x\n"), std::string("\n"), metrics_text(120) + "tail"}) {
    write_bytes(t.path / "m.jsonl", text);
    const std::string half = text.substr(0, text.size() / 2), rest = text.substr(text.size() / 2);
    write_bytes(t.path / "m.jsonl.zst", zstd_of(half) + zstd_of(rest, 19));
    EXPECT_EQ(lines_of(t.path / "m.jsonl"), getline_lines(text));
    EXPECT_EQ(lines_of(t.path / "m.jsonl.zst"), getline_lines(text));
  }
}

TEST(RunMetrics, DamagedArchivesAreRefusedNamingTheFile) {
  TempDir t("damaged");
  const std::string text = metrics_text(200);
  const std::string z = zstd_of(text, 19);
  write_run(t.path / "r", text);
  fs::remove(t.path / "r" / "metrics.jsonl");
  const fs::path zf = t.path / "r" / "metrics.jsonl.zst";
  // Truncated: the file ends inside the frame.
  for (size_t keep : {size_t(1), size_t(20), z.size() / 2, z.size() - 1}) {
    write_bytes(zf, z.substr(0, keep));
    const std::string e = error_of([&] { read_run(t.path / "r"); });
    EXPECT_NE(e.find(zf.string()), std::string::npos) << keep << ": " << e;
    EXPECT_TRUE(e.find("truncated") != std::string::npos || e.find("corrupt") != std::string::npos)
        << keep << ": " << e;
  }
  write_bytes(zf, z.substr(0, z.size() / 2));
  EXPECT_NE(error_of([&] { read_run(t.path / "r"); }).find("truncated zstd data"), std::string::npos);
  // Empty, not zstd at all, a flipped byte in the data (caught by the content checksum).
  write_bytes(zf, "");
  EXPECT_NE(error_of([&] { read_run(t.path / "r"); }).find(zf.string() + " is empty"),
            std::string::npos);
  write_bytes(zf, text);
  EXPECT_NE(error_of([&] { read_run(t.path / "r"); }).find(zf.string() + ": corrupt zstd data"),
            std::string::npos);
  {
    std::string c(ZSTD_compressBound(text.size()), '\0');
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    c.resize(ZSTD_compress2(cctx, c.data(), c.size(), text.data(), text.size()));
    ZSTD_freeCCtx(cctx);
    c[c.size() - 2] ^= 0x40;  // inside the 4-byte checksum
    write_bytes(zf, c);
    const std::string e = error_of([&] { read_run(t.path / "r"); });
    EXPECT_NE(e.find(zf.string() + ": corrupt zstd data"), std::string::npos) << e;
  }
  // Both files: ambiguous, refused; neither: the plain name is given.
  write_bytes(zf, z);
  write_bytes(t.path / "r" / "metrics.jsonl", text);
  EXPECT_NE(error_of([&] { read_run(t.path / "r"); }).find("holds both metrics.jsonl and metrics.jsonl.zst"),
            std::string::npos);
  fs::remove(zf);
  fs::remove(t.path / "r" / "metrics.jsonl");
  EXPECT_NE(error_of([&] { read_run(t.path / "r"); }).find("cannot read " + (t.path / "r" / "metrics.jsonl").string()),
            std::string::npos);
}

TEST(RunMetrics, CompactKeepsTheBytesAndIsIdempotent) {
  TempDir t("compact");
  const std::string text = metrics_text(300);
  const fs::path d = t.path / "r";
  write_run(d, text);
  const RunRecord before = read_run(d);
  const CompactResult c = compact_run_metrics(d);
  EXPECT_FALSE(c.already);
  EXPECT_EQ(c.plain_bytes, text.size());
  EXPECT_EQ(c.compact_bytes, fs::file_size(d / "metrics.jsonl.zst"));
  EXPECT_LT(c.compact_bytes, text.size() / 3);
  EXPECT_FALSE(fs::exists(d / "metrics.jsonl"));
  // The archive decompresses (libzstd's one-shot API) to the log byte for byte.
  const std::string z = read_bytes(d / "metrics.jsonl.zst");
  std::string back(ZSTD_getFrameContentSize(z.data(), z.size()), '\0');
  ASSERT_EQ(ZSTD_decompress(back.data(), back.size(), z.data(), z.size()), text.size());
  EXPECT_EQ(back, text);
  const RunRecord after = read_run(d);
  EXPECT_EQ(before.step, after.step);
  EXPECT_EQ(before.loss, after.loss);
  // Again: nothing changes.
  const CompactResult again = compact_run_metrics(d);
  EXPECT_TRUE(again.already);
  EXPECT_EQ(again.plain_bytes, text.size());
  EXPECT_EQ(read_bytes(d / "metrics.jsonl.zst"), z);
  // A compaction cut off before the plain log was removed: finished from the plain log.
  write_bytes(d / "metrics.jsonl", text);
  write_bytes(d / "metrics.jsonl.zst", "stale");
  EXPECT_FALSE(compact_run_metrics(d).already);
  EXPECT_FALSE(fs::exists(d / "metrics.jsonl"));
  EXPECT_EQ(lines_of(d / "metrics.jsonl.zst"), getline_lines(text));
  // An already compacted run whose archive is damaged is reported, not passed.
  write_bytes(d / "metrics.jsonl.zst", z.substr(0, z.size() / 2));
  EXPECT_NE(error_of([&] { compact_run_metrics(d); }).find("truncated"), std::string::npos);
  EXPECT_NE(error_of([&] { compact_run_metrics(d, 0); }).find("out of range"), std::string::npos);
}

TEST(RunMetrics, CompactRefusesRunsNotFinishedOrInUse) {
  TempDir t("refuse");
  const std::string text = metrics_text(20);
  const fs::path d = t.path / "r";
  fs::create_directories(d);
  write_bytes(d / "metrics.jsonl", text);
  // Still training or stopped: no summary, no error.txt.
  EXPECT_NE(error_of([&] { compact_run_metrics(d); }).find("has not finished"), std::string::npos);
  // A failed run is not a result.
  std::ofstream(d / "error.txt") << "failed in step 3 of 20 (recipe bf16): write failed\n";
  EXPECT_NE(error_of([&] { compact_run_metrics(d); }).find("failed"), std::string::npos);
  EXPECT_EQ(read_bytes(d / "metrics.jsonl"), text);
  EXPECT_FALSE(fs::exists(d / "metrics.jsonl.zst"));
  // A diverged run is one: compacted.
  std::ofstream(d / "error.txt") << "non-finite training loss (nan) at step 13 with recipe x; the run diverged.\n";
  EXPECT_FALSE(compact_run_metrics(d).already);
  // A summary that is not a completed one.
  const fs::path e = t.path / "e";
  write_run(e, text);
  std::ofstream(e / "summary.json") << R"({"status":"running"})";
  EXPECT_NE(error_of([&] { compact_run_metrics(e); }).find("not a completed run's summary"),
            std::string::npos);
  // Locked by a process training into it (fp4::train's flock on .fp4train.lock).
  write_run(e, text);
  const fs::path lock = e / ".fp4train.lock";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  // flock locks belong to the open file description: a second open in this process
  // conflicts as another process's would.
  const std::string err = error_of([&] { compact_run_metrics(e); });
  EXPECT_NE(err.find("in use by another fp4train process"), std::string::npos) << err;
  EXPECT_EQ(read_bytes(e / "metrics.jsonl"), text);
  ::close(fd);
  EXPECT_FALSE(compact_run_metrics(e).already);  // the lock released
  EXPECT_NE(error_of([&] { compact_run_metrics(t.path / "nope"); }).find("is not a directory"),
            std::string::npos);
}
