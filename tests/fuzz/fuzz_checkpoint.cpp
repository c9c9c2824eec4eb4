// Fuzz target: training checkpoints (safetensors), through checkpoint_from_bytes, the code of
// load_checkpoint (train --resume, eval, compare). Each input is tried twice: as it is, and
// with its checksum recomputed (when its header parses and its four tensors lie in the file),
// so that mutations reach the checks behind the checksum (metadata, the config and recipe
// TOML, the references, the trainer state) instead of all stopping at "checksum mismatch".
// Property: an accepted checkpoint re-saves (checkpoint_to_bytes) to bytes that load to the
// same checkpoint (every field, floats bit for bit) and re-save to the same bytes; with
// --exact (files save_checkpoint wrote: the seeds), the re-saved bytes are the input's.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "fp4/train/checkpoint.h"
#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"
#include "fuzz_common.h"

namespace {
using fp4::Checkpoint;
using nlohmann::json;

bool same_doubles(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), 8 * a.size()) == 0);
}
bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}
// NaN == NaN (a missing evaluation), else bitwise.
bool same_real(double a, double b) { return (std::isnan(a) && std::isnan(b)) || fuzz::same_bits(a, b); }

bool same(const Checkpoint& a, const Checkpoint& b) {
  if (a.references.size() != b.references.size()) return false;
  for (size_t i = 0; i < a.references.size(); ++i) {
    const auto &x = a.references[i], &y = b.references[i];
    if (x.linear != y.linear || x.role != y.role || x.has_value != y.has_value ||
        x.last_refresh != y.last_refresh || !fuzz::same_bits(x.held, y.held))
      return false;
  }
  return a.step == b.step && a.config_toml == b.config_toml && a.recipe_toml == b.recipe_toml &&
         same_floats(a.params, b.params) && same_floats(a.adam_m, b.adam_m) &&
         same_floats(a.adam_v, b.adam_v) && a.sampler_draws == b.sampler_draws &&
         same_doubles(a.losses, b.losses) && same_real(a.train_seconds, b.train_seconds) &&
         same_real(a.wall_seconds, b.wall_seconds) && same_real(a.val_nll, b.val_nll) &&
         same_real(a.val_nll_quant, b.val_nll_quant) && a.telemetry_digest == b.telemetry_digest &&
         a.data_key == b.data_key && a.config_name == b.config_name &&
         a.save_every == b.save_every && a.keep_checkpoints == b.keep_checkpoints &&
         a.log_every == b.log_every && a.save_amax == b.save_amax;
}

void check(std::string_view in, bool exact) {
  Checkpoint c;
  try {
    c = fp4::checkpoint_from_bytes(in, "fuzz.safetensors");
  } catch (const fp4::UserError&) {
    return;
  }
  const std::string y = fp4::checkpoint_to_bytes(c);
  Checkpoint c2;
  try {
    c2 = fp4::checkpoint_from_bytes(y, "resaved.safetensors");
  } catch (const fp4::UserError& e) {
    FUZZ_CHECK(false, std::string("a re-saved checkpoint does not load: ") + e.what());
  }
  FUZZ_CHECK(same(c, c2), "the re-saved checkpoint loads to another checkpoint");
  FUZZ_CHECK(fp4::checkpoint_to_bytes(c2) == y, "re-saving is not a fixed point");
  if (exact) FUZZ_CHECK(y == in, "a checkpoint save_checkpoint wrote re-saves to other bytes");
}

// The checksum of checkpoint.cpp (FNV-1a 64 of the header's dump without "checksum", then of
// the losses, params, adam_m, adam_v bytes), recomputed and stored: the fixed-up file, or ""
// where that is not possible.
std::string with_checksum(std::string_view in) {
  try {
    const auto f = fp4::safetensors::File::from_bytes(in, "fuzz", "fuzz");
    json h = f.header();
    if (!h.contains("__metadata__") || !h["__metadata__"].is_object()) return "";
    h["__metadata__"].erase("checksum");
    const std::string d = h.dump();
    uint64_t x = fp4::fnv1a64(d.data(), d.size());
    for (const char* name : {"losses", "params", "adam_m", "adam_v"}) {
      const auto t = f.tensor(name, std::string(name) == "losses" ? "F64" : "F32");
      x = fp4::fnv1a64(t.data(), t.size(), x);
    }
    char hex[20];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(x));
    h["__metadata__"]["checksum"] = hex;
    const std::string head = fp4::safetensors::header_bytes(h);
    return head + std::string(reinterpret_cast<const char*>(f.data().data()), f.data().size());
  } catch (const fp4::UserError&) {
    return "";
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in = fuzz::bytes(data, size);
  check(in, g_fuzz_exact);
  const std::string fixed = with_checksum(in);
  if (!fixed.empty() && fixed != in) check(fixed, false);
  return 0;
}
