// safetensors container and durable atomic writes (see include/fp4/base/safetensors.h).
#include "fp4/base/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "safetensors tensors are little-endian; this build copies host bytes as they are");

namespace {
std::string errno_text() { return std::strerror(errno); }

void fsync_dir(const fs::path& dir) {
  const int d = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (d < 0) return;  // best effort: some file systems do not allow opening directories
  (void)::fsync(d);
  ::close(d);
}

// Test hooks (safetensors.h, "Test hooks of the durable writers"). Only the main thread of
// rank 0 writes these files, so plain counters suffice.
enum Kind { kCheckpoint = 0, kOtherFile = 1, kMetrics = 2 };
// FP4_TEST_KILL_AT=...:end and ...:after, as byte counts no write reaches.
constexpr uint64_t kEnd = UINT64_MAX - 1, kAfter = UINT64_MAX;
struct Faults {
  bool kill = false;
  int kill_kind = 0;
  uint64_t kill_n = 0, kill_k = 0;
  bool fail = false;
  uint64_t fail_after = 0;
  uint64_t count[3] = {0, 0, 0};  // writes of each kind begun
  uint64_t total = 0;             // bytes written by all hooked writes
};

uint64_t parse_u64(const std::string& v, const char* var, const std::string& whole) {
  uint64_t x = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size())
    throw UserError(std::string(var) + "=" + whole + ": '" + v + "' is not a non-negative integer");
  return x;
}

Faults read_faults() {
  Faults f;
  if (const char* e = std::getenv("FP4_TEST_KILL_AT"); e && *e) {
    const std::string v = e;
    const size_t a = v.find(':'), b = a == std::string::npos ? a : v.find(':', a + 1);
    const std::string kind = v.substr(0, a);
    if (b == std::string::npos || (kind != "checkpoint" && kind != "file" && kind != "metrics"))
      throw UserError("FP4_TEST_KILL_AT=" + v +
                      ": expected KIND:N:K with KIND checkpoint, file or metrics");
    f.kill = true;
    f.kill_kind = kind == "checkpoint" ? kCheckpoint : kind == "file" ? kOtherFile : kMetrics;
    f.kill_n = parse_u64(v.substr(a + 1, b - a - 1), "FP4_TEST_KILL_AT", v);
    const std::string k = v.substr(b + 1);
    f.kill_k = k == "end" ? kEnd : k == "after" ? kAfter : parse_u64(k, "FP4_TEST_KILL_AT", v);
  }
  if (const char* e = std::getenv("FP4_TEST_FAIL_WRITE_AFTER"); e && *e) {
    f.fail = true;
    f.fail_after = parse_u64(e, "FP4_TEST_FAIL_WRITE_AFTER", e);
  }
  return f;
}

Faults& faults() {
  static Faults f = read_faults();
  return f;
}

// The 1-based number of a new write of `kind`.
uint64_t begin_write(int kind) { return ++faults().count[kind]; }

bool kill_armed(int kind, uint64_t index) {
  const Faults& f = faults();
  return f.kill && f.kill_kind == kind && f.kill_n == index;
}

// The end of write `index` of `kind`, `written` bytes long: a kill planned at or past its
// last byte happens here. An AtomicFile calls it before its commit (`committed` false: K equal
// to its size, or `end`, kills) and after it (the rest: K past its size, `after`); an
// AppendFile once, after its record (`committed` true).
void end_write(int kind, uint64_t index, uint64_t written, bool committed) {
  if (!kill_armed(kind, index)) return;
  const uint64_t k = faults().kill_k;
  if (committed || k <= written || k == kEnd) ::raise(SIGKILL);
}

// write(2) of up to `n` bytes of write `index` of `kind`, `written` bytes of which are done,
// through the test hooks; returns what write(2) returns (a kill does not return).
ssize_t hooked_write(int fd, const void* p, size_t n, int kind, uint64_t index, uint64_t written) {
  Faults& f = faults();
  size_t allow = n;
  const bool kill = kill_armed(kind, index) && written + n >= f.kill_k;
  if (kill) allow = f.kill_k > written ? static_cast<size_t>(f.kill_k - written) : 0;
  if (f.fail && f.total + allow > f.fail_after) {
    allow = static_cast<size_t>(f.fail_after - std::min(f.fail_after, f.total));
    if (allow == 0) {
      errno = ENOSPC;
      return -1;
    }
  }
  ssize_t w = allow == 0 ? 0 : ::write(fd, p, allow);
  if (w > 0) f.total += static_cast<uint64_t>(w);
  if (kill && w >= 0 && written + static_cast<uint64_t>(w) >= f.kill_k) ::raise(SIGKILL);
  if (w == 0 && n > 0) {  // nothing allowed by the failure hook
    errno = ENOSPC;
    return -1;
  }
  return w;
}

// Write all `n` bytes (retrying short writes and EINTR); false with errno set on failure.
bool write_all(int fd, const void* data, size_t n, int kind, uint64_t index, uint64_t& written) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = hooked_write(fd, p, n, kind, index, written);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
    written += static_cast<uint64_t>(w);
  }
  return true;
}
}  // namespace

void fsync_file(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError("cannot open " + file.string() + " to fsync it: " + errno_text());
  const int rc = ::fsync(fd);
  const std::string why = rc != 0 ? errno_text() : "";
  ::close(fd);
  if (rc != 0) throw IoError("fsync failed: " + file.string() + ": " + why);
  fsync_dir(file.parent_path());
}

AtomicFile::AtomicFile(const fs::path& file) : file_(file), tmp_(file.string() + ".tmp") {
  kind_ = file.extension() == ".safetensors" ? kCheckpoint : kOtherFile;
  index_ = begin_write(kind_);  // first: it throws on a malformed test-hook variable
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const std::string why = errno_text();
    throw UserError("cannot write " + tmp_.string() + ": " + why);
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t bytes) {
  if (!write_all(fd_, data, bytes, kind_, index_, written_)) {
    const std::string why = errno_text();
    throw IoError("write failed: " + tmp_.string() + ": " + why);
  }
}

void AtomicFile::commit() {
  end_write(kind_, index_, written_, /*committed=*/false);
  if (::fsync(fd_) != 0) {
    const std::string why = errno_text();
    throw IoError("fsync failed: " + tmp_.string() + ": " + why);
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp_.c_str());
    throw IoError("write failed: " + tmp_.string() + ": " + why);
  }
  if (::rename(tmp_.c_str(), file_.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp_.c_str());
    throw IoError("cannot rename " + tmp_.string() + " to " + file_.string() + ": " + why);
  }
  fsync_dir(file_.parent_path());
  end_write(kind_, index_, written_, /*committed=*/true);
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::open(const fs::path& file, bool truncate) {
  if (fd_ >= 0) ::close(fd_);
  file_ = file;
  fd_ = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0),
               0644);
  if (fd_ < 0) {
    const std::string why = errno_text();
    throw UserError("cannot write " + file.string() + ": " + why);
  }
}

void AppendFile::append(std::string_view record) {
  if (fd_ < 0) throw std::logic_error("AppendFile::append: not open");
  const uint64_t index = begin_write(kMetrics);
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  uint64_t written = 0;
  if (!write_all(fd_, record.data(), record.size(), kMetrics, index, written)) {
    const std::string why = errno_text();
    // Leave whole records only: cut off the part of this one that was written.
    if (before >= 0 && written > 0) (void)::ftruncate(fd_, before);
    throw IoError("write failed: " + file_.string() + ": " + why);
  }
  end_write(kMetrics, index, written, /*committed=*/true);
}

void AppendFile::sync() {
  if (fd_ < 0) throw std::logic_error("AppendFile::sync: not open");
  if (::fsync(fd_) != 0) {
    const std::string why = errno_text();
    throw IoError("fsync failed: " + file_.string() + ": " + why);
  }
  fsync_dir(file_.parent_path());
}

void write_file_atomic(const fs::path& file, std::string_view bytes) {
  AtomicFile f(file);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

namespace safetensors {

size_t dtype_size(const std::string& d) {
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  if (d == "U16" || d == "I16" || d == "F16" || d == "BF16") return 2;
  if (d == "U32" || d == "I32" || d == "F32") return 4;
  if (d == "U64" || d == "I64" || d == "F64") return 8;
  return 0;
}

json make_header(const std::vector<TensorOut>& tensors, const json& metadata) {
  json h = json::object();
  uint64_t off = 0;
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (int64_t s : t.shape) n *= static_cast<uint64_t>(s);
    if (dtype_size(t.dtype) == 0 || n * dtype_size(t.dtype) != t.bytes)
      throw std::invalid_argument("safetensors: tensor '" + t.name + "' of dtype " + t.dtype +
                                  " has " + std::to_string(t.bytes) + " bytes for its shape");
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes}}};
    off += t.bytes;
  }
  if (!metadata.is_null() && !metadata.empty()) h["__metadata__"] = metadata;
  return h;
}

std::string header_bytes(const json& header) {
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text += ' ';  // align the data to 8 bytes
  const uint64_t hn = text.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(hn >> (8 * i));
  return out + text;
}

void write_file(const fs::path& file, const json& header, const std::vector<TensorOut>& tensors) {
  const std::string head = header_bytes(header);
  AtomicFile f(file);
  f.write(head.data(), head.size());
  for (const auto& t : tensors) f.write(t.data, t.bytes);
  f.commit();
}

std::string to_bytes(const json& header, const std::vector<TensorOut>& tensors) {
  std::string out = header_bytes(header);
  for (const auto& t : tensors)
    if (t.bytes > 0) out.append(static_cast<const char*>(t.data), t.bytes);
  return out;
}

// The file is not read whole into memory first: the tensor bytes go straight to data_ (a
// checkpoint can be gigabytes). What is parsed is the same as from_bytes: parse_header.
File::File(const fs::path& file, std::string kind) : name_(file.string()), kind_(std::move(kind)) {
  std::ifstream f(file, std::ios::binary);
  std::error_code ec;
  if (!f || !fs::is_regular_file(file, ec)) throw UserError(name_ + ": cannot open");
  const auto size = static_cast<uint64_t>(fs::file_size(file, ec));
  if (ec) throw UserError(name_ + ": cannot open (" + ec.message() + ")");
  char len[8] = {};
  if (size >= 8 && !f.read(len, 8)) throw error("shorter than 8 bytes");
  const uint64_t hn = header_length(std::string_view(len, size >= 8 ? 8 : 0), size);
  std::string text(hn, '\0');
  if (!f.read(text.data(), static_cast<std::streamsize>(hn))) throw error("cannot read the header");
  parse_header(text);
  data_.resize(size - 8 - hn);
  if (!f.read(reinterpret_cast<char*>(data_.data()), static_cast<std::streamsize>(data_.size())))
    throw error("cannot read the tensor data");
}

File File::from_bytes(std::string_view bytes, std::string name, std::string kind) {
  File f(std::move(name), std::move(kind));
  const uint64_t hn = f.header_length(bytes.substr(0, 8), bytes.size());
  f.parse_header(bytes.substr(8, hn));
  const std::string_view rest = bytes.substr(8 + hn);
  f.data_.assign(rest.begin(), rest.end());
  return f;
}

uint64_t File::header_length(std::string_view first8, uint64_t size) const {
  if (size < 8 || first8.size() < 8) throw error("shorter than 8 bytes");
  uint64_t hn = 0;
  for (int i = 0; i < 8; ++i)
    hn |= uint64_t(static_cast<unsigned char>(first8[static_cast<size_t>(i)])) << (8 * i);
  // A text file (a TOML config, a JSON log) given where a checkpoint belongs: its first 8
  // bytes are characters, where a safetensors file has a little-endian length whose high
  // bytes are 0.
  bool text = true;
  for (int i = 0; i < 8; ++i) {
    const unsigned char c = static_cast<unsigned char>(first8[static_cast<size_t>(i)]);
    text &= (c >= 0x20 && c < 0x7f) || c == '\n' || c == '\r' || c == '\t';
  }
  if (text && hn > size - 8) {
    std::string head(first8.substr(0, 8));
    for (char& c : head)
      if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    throw error("not a safetensors file (a checkpoint such as runs/NAME/checkpoints/"
                "step_N.safetensors): it starts with text \"" + head + "\", where a safetensors "
                "file starts with the 8-byte length of its JSON header");
  }
  if (hn > size - 8)
    throw error("header length " + std::to_string(hn) + " exceeds the file (" +
                std::to_string(size) + " bytes; truncated?)");
  return hn;
}

void File::parse_header(std::string_view text) {
  try {
    header_ = json::parse(text);
  } catch (const json::exception& e) {
    throw error(std::string("header is not JSON (") + e.what() + ")");
  }
  if (!header_.is_object()) throw error("header is not a JSON object");
}

UserError File::error(const std::string& what) const {
  return UserError(name_ + ": not a valid " + kind_ + " safetensors file: " + what);
}

std::span<const uint8_t> File::tensor(const std::string& name, const std::string& dtype) const {
  const auto it = header_.find(name);
  if (it == header_.end() || !it->is_object()) throw error("tensor '" + name + "' is missing");
  const json& e = *it;
  const auto d = e.find("dtype");
  if (d == e.end() || !d->is_string() || *d != dtype)
    throw error("tensor '" + name + "' has dtype " + (d == e.end() ? "(none)" : d->dump()) +
                ", expected \"" + dtype + "\"");
  const auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    throw error("tensor '" + name + "': data_offsets must be two unsigned integers");
  const uint64_t b = (*off)[0], en = (*off)[1];
  if (b > en || en > data_.size())
    throw error("tensor '" + name + "' lies outside the file (truncated?)");
  const auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) throw error("tensor '" + name + "': shape is missing");
  uint64_t n = 1;
  for (const json& s : *sh) {
    if (!s.is_number_unsigned()) throw error("tensor '" + name + "': shape " + sh->dump() + " is not a list of sizes");
    const uint64_t v = s;
    if (v != 0 && n > (uint64_t{1} << 50) / v) throw error("tensor '" + name + "': shape " + sh->dump() + " is too large");
    n *= v;
  }
  if (n * dtype_size(dtype) != en - b)
    throw error("tensor '" + name + "' has shape " + sh->dump() + " (" +
                std::to_string(n * dtype_size(dtype)) + " bytes) but data_offsets span " +
                std::to_string(en - b) + " bytes");
  return {data_.data() + b, static_cast<size_t>(en - b)};
}

std::string File::meta(const std::string& key) const {
  const auto m = header_.find("__metadata__");
  if (m == header_.end() || !m->is_object()) throw error("__metadata__ is missing");
  const auto v = m->find(key);
  if (v == m->end()) throw error("metadata '" + key + "' is missing");
  if (!v->is_string()) throw error("metadata '" + key + "' is not a string");
  return *v;
}

}  // namespace safetensors
}  // namespace fp4
