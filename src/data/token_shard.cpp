// Token streams and the files that hold token ids (see include/fp4/data/data.h):
//  * TokenStream: ids in memory or memory-mapped, 2 or 4 bytes each, little-endian;
//  * token shards of the cache (train.bin, heldout.bin): bytes to ids and back, the
//    incremental writer, the memory-mapped reader;
//  * pre-tokenized input files (llm.c shards, headerless uint16 / uint32): their layout.
// Shard layout, version 2 (little-endian): "FP4TOK01" | uint32 2 | uint32 vocab |
// uint32 token_bytes | uint32 0 | uint64 count | count x token_bytes ids. Version 1 (read
// only): "FP4TOK01" | uint32 1 | uint32 vocab | uint64 count | count x uint16 ids.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <algorithm>
#include <stdexcept>
#include <system_error>

#include "fp4/data/data.h"
#include "fp4/base/error.h"

namespace fp4 {
namespace fs = std::filesystem;

namespace {
constexpr char kMagic[8] = {'F', 'P', '4', 'T', 'O', 'K', '0', '1'};
constexpr size_t kHeaderV1 = 8 + 4 + 4 + 8, kHeaderV2 = 8 + 4 + 4 + 4 + 4 + 8;
constexpr uint32_t kLlmcMagic16 = 20240520, kLlmcVersion16 = 1;
constexpr uint32_t kLlmcMagic32 = 20240801, kLlmcVersion32 = 7;
constexpr size_t kLlmcHeader = 256 * 4;

uint64_t get_le(std::string_view b, size_t off, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(b[off + i])} << (8 * i);
  return v;
}
void put_le(char* dst, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) dst[i] = static_cast<char>(v >> (8 * i));
}
}  // namespace

// ---------------------------------------------------------------------------------------
// TokenStream

struct TokenStream::Storage {
  std::vector<unsigned char> bytes;
  void* map = nullptr;
  size_t map_len = 0;
  ~Storage() {
    if (map) ::munmap(map, map_len);
  }
};

TokenStream TokenStream::from_ids(const std::vector<uint32_t>& ids, int token_bytes) {
  if (token_bytes != 2 && token_bytes != 4)
    throw UserError("token ids take 2 or 4 bytes, not " + std::to_string(token_bytes));
  auto st = std::make_shared<Storage>();
  st->bytes.resize(ids.size() * static_cast<size_t>(token_bytes));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (token_bytes == 2 && ids[i] > 0xFFFF)
      throw UserError("token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                      " does not fit in 2 bytes");
    put_le(reinterpret_cast<char*>(st->bytes.data()) + i * token_bytes, ids[i], token_bytes);
  }
  TokenStream t;
  t.p_ = st->bytes.data();
  t.n_ = ids.size();
  t.width_ = token_bytes;
  t.keep_ = std::move(st);
  return t;
}

TokenStream TokenStream::from_u16(const std::vector<uint16_t>& ids) {
  return from_ids(std::vector<uint32_t>(ids.begin(), ids.end()), 2);
}

TokenStream TokenStream::map_file(const fs::path& file, uint64_t offset, uint64_t count,
                                  int token_bytes) {
  if (token_bytes != 2 && token_bytes != 4)
    throw UserError("token ids take 2 or 4 bytes, not " + std::to_string(token_bytes));
  TokenStream t;
  t.width_ = token_bytes;
  if (count == 0) return t;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError("cannot open token file '" + file.string() + "': " + std::strerror(errno));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) {
    const int e = errno;
    ::close(fd);
    throw UserError("cannot stat token file '" + file.string() + "': " + std::strerror(e));
  }
  const uint64_t need = offset + count * static_cast<uint64_t>(token_bytes);
  if (static_cast<uint64_t>(sb.st_size) < need) {
    ::close(fd);
    throw UserError("token file '" + file.string() + "' has " + std::to_string(sb.st_size) +
                    " bytes, fewer than the " + std::to_string(need) + " its header promises");
  }
  void* m = ::mmap(nullptr, need, PROT_READ, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (m == MAP_FAILED)
    throw UserError("cannot memory-map token file '" + file.string() + "': " + std::strerror(e));
  ::madvise(m, need, MADV_RANDOM);  // training windows are read at random offsets
  auto st = std::make_shared<Storage>();
  st->map = m;
  st->map_len = need;
  t.p_ = static_cast<const unsigned char*>(m) + offset;
  t.n_ = count;
  t.keep_ = std::move(st);
  return t;
}

void TokenStream::read(size_t start, size_t n, int32_t* out) const {
  if (start > n_ || n > n_ - start)
    throw std::out_of_range("TokenStream::read [" + std::to_string(start) + ", " +
                            std::to_string(start + n) + ") past " + std::to_string(n_) + " ids");
  const unsigned char* q = p_ + start * static_cast<size_t>(width_);
  if (width_ == 2) {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(uint32_t{q[2 * i]} | uint32_t{q[2 * i + 1]} << 8);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>((*this)[start + i]);
  }
}

TokenStream TokenStream::slice(size_t start, size_t n) const {
  if (start > n_ || n > n_ - start)
    throw std::out_of_range("TokenStream::slice past the end");
  TokenStream t = *this;
  t.p_ = p_ + start * static_cast<size_t>(width_);
  t.n_ = n;
  return t;
}

std::vector<uint32_t> TokenStream::ids() const {
  std::vector<uint32_t> v(n_);
  for (size_t i = 0; i < n_; ++i) v[i] = (*this)[i];
  return v;
}

size_t TokenStream::first_at_or_above(uint32_t vocab) const {
  if (width_ == 2 && vocab > 0xFFFF) return n_;
  for (size_t i = 0; i < n_; ++i)
    if ((*this)[i] >= vocab) return i;
  return n_;
}

// ---------------------------------------------------------------------------------------
// Token shards of the cache

std::string token_cache_corrupt(const fs::path& file, const std::string& why) {
  return "token cache file '" + file.string() + "' is corrupt (" + why + "); delete '" +
         file.parent_path().string() + "' to rebuild it";
}

std::string token_shard_to_bytes(const TokenStream& tokens, int vocab) {
  const std::string_view ids = tokens.bytes();
  std::string b(kHeaderV2 + ids.size(), '\0');
  char* p = b.data();
  std::memcpy(p, kMagic, 8);
  put_le(p + 8, kTokenShardVersion, 4);
  put_le(p + 12, static_cast<uint32_t>(vocab), 4);
  put_le(p + 16, static_cast<uint32_t>(tokens.token_bytes()), 4);
  put_le(p + 20, 0, 4);
  put_le(p + 24, tokens.size(), 8);
  if (!ids.empty()) std::memcpy(p + kHeaderV2, ids.data(), ids.size());
  return b;
}

TokenShardLayout token_shard_layout(std::string_view b, uint64_t file_size, int vocab,
                                    const fs::path& name) {
  auto corrupt = [&](const std::string& why) { return UserError(token_cache_corrupt(name, why)); };
  if (b.size() < kHeaderV1 || file_size < kHeaderV1)
    throw corrupt("only " + std::to_string(file_size) + " bytes, the header alone is " +
                  std::to_string(kHeaderV1));
  if (std::memcmp(b.data(), kMagic, 8) != 0) throw corrupt("bad magic");
  TokenShardLayout l;
  l.version = static_cast<uint32_t>(get_le(b, 8, 4));
  const uint64_t file_vocab = get_le(b, 12, 4);
  if (l.version == 1) {
    l.token_bytes = 2;
    l.count = get_le(b, 16, 8);
    l.header_bytes = kHeaderV1;
  } else if (l.version == 2) {
    if (b.size() < kHeaderV2 || file_size < kHeaderV2)
      throw corrupt("only " + std::to_string(file_size) + " bytes, the version-2 header alone is " +
                    std::to_string(kHeaderV2));
    const uint64_t w = get_le(b, 16, 4);
    if (w != 2 && w != 4) throw corrupt("token width " + std::to_string(w) + ", expected 2 or 4");
    if (get_le(b, 20, 4) != 0) throw corrupt("reserved header field is not 0");
    l.token_bytes = static_cast<int>(w);
    l.count = get_le(b, 24, 8);
    l.header_bytes = kHeaderV2;
  } else {
    throw corrupt("version " + std::to_string(l.version) + ", expected 1 or " +
                  std::to_string(kTokenShardVersion));
  }
  if (file_vocab != static_cast<uint64_t>(vocab))
    throw corrupt("vocab " + std::to_string(file_vocab) + ", expected " + std::to_string(vocab));
  if (l.token_bytes < token_bytes_for_vocab(vocab))
    throw corrupt(std::to_string(l.token_bytes) + "-byte ids cannot hold a vocabulary of " +
                  std::to_string(vocab));
  const uint64_t payload = file_size - l.header_bytes;
  if (l.count > payload / l.token_bytes || payload != l.count * l.token_bytes)
    throw corrupt("header says " + std::to_string(l.count) + " tokens but the file holds " +
                  std::to_string(payload) + " payload bytes");
  return l;
}

namespace {
UserError id_outside_vocab(const fs::path& name, uint32_t id, uint64_t index) {
  return UserError(token_cache_corrupt(name, "token " + std::to_string(id) + " at index " +
                                                 std::to_string(index) + " is outside the vocabulary"));
}

void check_ids(const TokenStream& t, int vocab, const fs::path& name) {
  const size_t bad = t.first_at_or_above(static_cast<uint32_t>(vocab));
  if (bad != t.size()) throw id_outside_vocab(name, t[bad], bad);
}
}  // namespace

TokenStream token_shard_from_bytes(std::string_view b, int vocab, const fs::path& name) {
  const TokenShardLayout l = token_shard_layout(b, b.size(), vocab, name);
  std::vector<uint32_t> ids(l.count);
  for (size_t i = 0; i < l.count; ++i)
    ids[i] = static_cast<uint32_t>(get_le(b, l.header_bytes + i * l.token_bytes, l.token_bytes));
  TokenStream t = TokenStream::from_ids(ids, l.token_bytes);
  check_ids(t, vocab, name);
  return t;
}

void read_token_chunks(const fs::path& file, uint64_t offset, uint64_t count, int token_bytes,
                       const std::function<void(const uint32_t*, size_t, uint64_t)>& fn) {
  if (token_bytes != 2 && token_bytes != 4)
    throw UserError("token ids take 2 or 4 bytes, not " + std::to_string(token_bytes));
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (!f) throw UserError("cannot open token file '" + file.string() + "': " + std::strerror(errno));
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  if (offset && std::fseek(f, static_cast<long>(offset), SEEK_SET) != 0)
    throw UserError("cannot read token file '" + file.string() + "': " + std::strerror(errno));
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<unsigned char> raw(kChunk * static_cast<size_t>(token_bytes));
  std::vector<uint32_t> ids(kChunk);
  for (uint64_t done = 0; done < count;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, count - done));
    const size_t want = n * static_cast<size_t>(token_bytes);
    if (std::fread(raw.data(), 1, want, f) != want)
      throw UserError("token file '" + file.string() + "' ends before its " + std::to_string(count) +
                      " ids (read " + std::to_string(done) + ")");
    const unsigned char* q = raw.data();
    if (token_bytes == 2)
      for (size_t i = 0; i < n; ++i) ids[i] = uint32_t{q[2 * i]} | uint32_t{q[2 * i + 1]} << 8;
    else
      for (size_t i = 0; i < n; ++i)
        ids[i] = uint32_t{q[4 * i]} | uint32_t{q[4 * i + 1]} << 8 | uint32_t{q[4 * i + 2]} << 16 |
                 uint32_t{q[4 * i + 3]} << 24;
    fn(ids.data(), n, done);
    done += n;
  }
}

TokenStream map_token_shard(const fs::path& file, int vocab) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw UserError(token_cache_corrupt(file, "missing or unreadable"));
  std::string head(kHeaderV2, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  if (ec) throw UserError(token_cache_corrupt(file, "cannot read its size: " + ec.message()));
  const TokenShardLayout l = token_shard_layout(head, size, vocab, file);
  read_token_chunks(file, l.header_bytes, l.count, l.token_bytes,
                    [&](const uint32_t* ids, size_t n, uint64_t first) {
                      for (size_t i = 0; i < n; ++i)
                        if (ids[i] >= static_cast<uint32_t>(vocab)) throw id_outside_vocab(file, ids[i], first + i);
                    });
  return TokenStream::map_file(file, l.header_bytes, l.count, l.token_bytes);
}

TokenShardWriter::TokenShardWriter(const fs::path& file, int vocab)
    : file_(file), vocab_(vocab), width_(token_bytes_for_vocab(vocab)) {
  f_ = std::fopen(file.c_str(), "wb");
  if (!f_) throw UserError("cannot write '" + file.string() + "': " + std::strerror(errno));
  buf_.reserve(1 << 20);
  buf_.assign(kHeaderV2, '\0');  // patched by finish()
}

TokenShardWriter::~TokenShardWriter() {
  if (f_) {
    std::fclose(f_);
    std::error_code ec;
    fs::remove(file_, ec);
  }
}

void TokenShardWriter::put(uint32_t id) {
  if (id >= static_cast<uint32_t>(vocab_))
    throw std::logic_error("TokenShardWriter: id " + std::to_string(id) + " >= vocab " +
                           std::to_string(vocab_));
  char b[4];
  put_le(b, id, width_);
  buf_.append(b, static_cast<size_t>(width_));
  ++count_;
}

void TokenShardWriter::append(const uint32_t* ids, size_t n) {
  for (size_t i = 0; i < n; ++i) put(ids[i]);
  if (buf_.size() >= (1u << 20)) flush_buffer();
}

void TokenShardWriter::append(const int* ids, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0) throw std::logic_error("TokenShardWriter: negative id");
    put(static_cast<uint32_t>(ids[i]));
  }
  if (buf_.size() >= (1u << 20)) flush_buffer();
}

void TokenShardWriter::flush_buffer() {
  if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size())
    throw UserError("cannot write '" + file_.string() + "' (disk full?)");
  buf_.clear();
}

void TokenShardWriter::finish() {
  flush_buffer();
  char h[kHeaderV2];
  std::memcpy(h, kMagic, 8);
  put_le(h + 8, kTokenShardVersion, 4);
  put_le(h + 12, static_cast<uint32_t>(vocab_), 4);
  put_le(h + 16, static_cast<uint32_t>(width_), 4);
  put_le(h + 20, 0, 4);
  put_le(h + 24, count_, 8);
  const bool ok = std::fseek(f_, 0, SEEK_SET) == 0 && std::fwrite(h, 1, kHeaderV2, f_) == kHeaderV2 &&
                  std::fflush(f_) == 0;
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok || !closed) {
    std::error_code ec;
    fs::remove(file_, ec);
    throw UserError("cannot write '" + file_.string() + "' (disk full?)");
  }
}

// ---------------------------------------------------------------------------------------
// Pre-tokenized input files

TokenFileLayout token_file_layout(std::string_view head, uint64_t file_size, const std::string& format,
                                  const fs::path& name) {
  auto bad = [&](const std::string& why) {
    return UserError("token file '" + name.string() + "' (data.format " + format + "): " + why);
  };
  TokenFileLayout l;
  if (format == "llmc") {
    if (file_size < kLlmcHeader || head.size() < kLlmcHeader)
      throw bad("only " + std::to_string(file_size) + " bytes, shorter than llm.c's 1024-byte header");
    const uint32_t magic = static_cast<uint32_t>(get_le(head, 0, 4));
    const uint32_t version = static_cast<uint32_t>(get_le(head, 4, 4));
    const int32_t count = static_cast<int32_t>(static_cast<uint32_t>(get_le(head, 8, 4)));
    if (magic == kLlmcMagic16 && version == kLlmcVersion16) {
      l.token_bytes = 2;
    } else if (magic == kLlmcMagic32 && version == kLlmcVersion32) {
      l.token_bytes = 4;
    } else if (magic == kLlmcMagic16 || magic == kLlmcMagic32) {
      throw bad("magic " + std::to_string(magic) + " with version " + std::to_string(version) +
                "; llm.c writes version 1 with magic 20240520 (uint16 ids) and 7 with 20240801 "
                "(uint32 ids)");
    } else {
      throw bad("magic " + std::to_string(magic) + " is not llm.c's (20240520 or 20240801)");
    }
    if (count < 0) throw bad("negative token count " + std::to_string(count));
    l.header_bytes = kLlmcHeader;
    l.count = static_cast<uint64_t>(count);
    const uint64_t want = kLlmcHeader + l.count * static_cast<uint64_t>(l.token_bytes);
    if (file_size != want)
      throw bad("the header says " + std::to_string(l.count) + " tokens (" + std::to_string(want) +
                " bytes with the header) but the file has " + std::to_string(file_size) +
                " bytes" + (file_size < want ? " (truncated?)" : ""));
    return l;
  }
  if (format == "uint16" || format == "uint32") {
    l.token_bytes = format == "uint16" ? 2 : 4;
    if (file_size % static_cast<uint64_t>(l.token_bytes) != 0)
      throw bad(std::to_string(file_size) + " bytes is not a whole number of " +
                std::to_string(l.token_bytes) + "-byte ids (truncated?)");
    l.count = file_size / static_cast<uint64_t>(l.token_bytes);
    return l;
  }
  throw bad("not a pre-tokenized format (llmc, uint16 or uint32)");
}

void write_token_file(const TokenStream& tokens, const fs::path& file, const std::string& format) {
  if (format != "llmc" && format != "uint16" && format != "uint32")
    throw UserError("token file format '" + format + "' is not one of llmc, uint16, uint32");
  int width = format == "uint16" ? 2 : format == "uint32" ? 4 : tokens.token_bytes();
  if (width < tokens.token_bytes() && tokens.first_at_or_above(65536) != tokens.size())
    throw UserError("ids above 65,535 do not fit the uint16 file '" + file.string() + "'");
  if (format == "llmc" && tokens.size() > 0x7FFFFFFFu)
    throw UserError("llm.c files hold at most 2^31 - 1 ids (an int32 count); '" + file.string() +
                    "' would hold " + std::to_string(tokens.size()));
  const fs::path tmp = file.string() + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw UserError("cannot write '" + tmp.string() + "': " + std::strerror(errno));
  bool ok = true;
  if (format == "llmc") {
    std::string h(kLlmcHeader, '\0');
    put_le(h.data(), width == 2 ? kLlmcMagic16 : kLlmcMagic32, 4);
    put_le(h.data() + 4, width == 2 ? kLlmcVersion16 : kLlmcVersion32, 4);
    put_le(h.data() + 8, tokens.size(), 4);
    ok = std::fwrite(h.data(), 1, h.size(), f) == h.size();
  }
  if (width == tokens.token_bytes()) {
    const std::string_view b = tokens.bytes();
    ok = ok && std::fwrite(b.data(), 1, b.size(), f) == b.size();
  } else {
    std::string buf;
    for (size_t i = 0; ok && i < tokens.size(); ++i) {
      char c[4];
      put_le(c, tokens[i], width);
      buf.append(c, static_cast<size_t>(width));
      if (buf.size() >= (1u << 20) || i + 1 == tokens.size()) {
        ok = std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
        buf.clear();
      }
    }
  }
  ok = (std::fclose(f) == 0) && ok;
  std::error_code ec;
  if (ok) fs::rename(tmp, file, ec);
  if (!ok || ec) {
    fs::remove(tmp, ec);
    throw UserError("cannot write '" + file.string() + "' (disk full?)");
  }
}

}  // namespace fp4
