// Training checkpoints as safetensors files (see include/fp4/train/checkpoint.h).
#include "fp4/train/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>

#include "fp4/base/error.h"
#include "fp4/base/safetensors.h"

namespace fp4 {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
constexpr const char* kFormat = "fp4train.checkpoint.v1";
constexpr const char* kKind = "fp4train checkpoint";

// JSON has no NaN: a missing evaluation is stored as null.
json nan_to_null(double v) { return std::isnan(v) ? json(nullptr) : json(v); }

std::string hex64(uint64_t v) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// Hash of the header (without the checksum entry) and of the tensor bytes, in file order.
uint64_t content_hash(const json& header_without_checksum, const std::vector<std::span<const uint8_t>>& parts) {
  const std::string h = header_without_checksum.dump();
  uint64_t x = fnv1a64(h.data(), h.size());
  for (const auto& p : parts) x = fnv1a64(p.data(), p.size(), x);
  return x;
}

template <class T>
std::span<const uint8_t> bytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

// The tensor list of a checkpoint, in file order.
std::vector<safetensors::TensorOut> tensors_of(const Checkpoint& c) {
  auto t = [](const char* name, const char* dtype, const auto& v) {
    return safetensors::TensorOut{name, dtype, {static_cast<int64_t>(v.size())}, v.data(),
                                  static_cast<uint64_t>(v.size() * sizeof(v[0]))};
  };
  return {t("losses", "F64", c.losses), t("params", "F32", c.params),
          t("adam_m", "F32", c.adam_m), t("adam_v", "F32", c.adam_v)};
}

bool parse_step_name(const std::string& name, int64_t& step) {
  const std::string pre = "step_", suf = ".safetensors";
  if (name.size() <= pre.size() + suf.size() || name.rfind(pre, 0) != 0 ||
      name.compare(name.size() - suf.size(), suf.size(), suf) != 0)
    return false;
  const char* b = name.data() + pre.size();
  const char* e = name.data() + name.size() - suf.size();
  if (e - b > 18) return false;
  for (const char* p = b; p < e; ++p)
    if (*p < '0' || *p > '9') return false;
  return std::from_chars(b, e, step).ec == std::errc();
}

fs::path checkpoint_dir(const fs::path& run_dir) {
  std::error_code ec;
  return fs::is_directory(run_dir / "checkpoints", ec) ? run_dir / "checkpoints" : run_dir;
}
}  // namespace

std::string checkpoint_file_name(int64_t step) {
  char b[64];
  std::snprintf(b, sizeof b, "step_%08lld.safetensors", static_cast<long long>(step));
  return b;
}

namespace {
// The header of c's file (checksum included) and its tensors, for save_checkpoint and
// checkpoint_to_bytes.
json checkpoint_header(const Checkpoint& c, std::vector<safetensors::TensorOut>& tensors) {
  const size_t n = c.params.size();
  if (c.adam_m.size() != n || c.adam_v.size() != n)
    throw std::invalid_argument("save_checkpoint: adam_m/adam_v must have params' size");
  if (!c.losses.empty() && c.losses.size() != static_cast<size_t>(c.step))
    throw std::invalid_argument("save_checkpoint: losses must be empty or `step` long");
  json refs = json::array();
  for (const auto& r : c.references)
    refs.push_back({{"linear", r.linear},
                    {"role", r.role},
                    {"has_value", r.has_value},
                    {"last_refresh", r.last_refresh},
                    {"held", r.held}});  // a float as a JSON double: reads back exactly
  const json trainer = {{"train_seconds", c.train_seconds},
                        {"wall_seconds", c.wall_seconds},
                        {"val_nll", nan_to_null(c.val_nll)},
                        {"val_nll_quant", nan_to_null(c.val_nll_quant)},
                        {"telemetry_digest", c.telemetry_digest},
                        {"data_key", c.data_key},
                        {"config_name", c.config_name},
                        {"save_every", c.save_every},
                        {"keep_checkpoints", c.keep_checkpoints},
                        {"log_every", c.log_every},
                        {"save_amax", c.save_amax}};
  const json meta = {{"format", kFormat},
                     {"step", std::to_string(c.step)},
                     {"sampler_draws", std::to_string(c.sampler_draws)},
                     {"config_toml", c.config_toml},
                     {"recipe_toml", c.recipe_toml},
                     {"references", refs.dump()},
                     {"trainer", trainer.dump()}};
  tensors = tensors_of(c);
  json header = safetensors::make_header(tensors, meta);
  const uint64_t hash = content_hash(
      header, {bytes_of(c.losses), bytes_of(c.params), bytes_of(c.adam_m), bytes_of(c.adam_v)});
  header["__metadata__"]["checksum"] = hex64(hash);
  return header;
}

Checkpoint parse_checkpoint(const safetensors::File& f);
}  // namespace

void save_checkpoint(const fs::path& file, const Checkpoint& c) {
  std::vector<safetensors::TensorOut> tensors;
  const json header = checkpoint_header(c, tensors);
  safetensors::write_file(file, header, tensors);
}

std::string checkpoint_to_bytes(const Checkpoint& c) {
  std::vector<safetensors::TensorOut> tensors;
  const json header = checkpoint_header(c, tensors);
  return safetensors::to_bytes(header, tensors);
}

Checkpoint load_checkpoint(const fs::path& file) { return parse_checkpoint(safetensors::File(file, kKind)); }

Checkpoint checkpoint_from_bytes(std::string_view bytes, const std::string& name) {
  return parse_checkpoint(safetensors::File::from_bytes(bytes, name, kKind));
}

namespace {
Checkpoint parse_checkpoint(const safetensors::File& f) {
  Checkpoint c;
  const std::string format = f.meta("format");
  if (format != kFormat)
    throw f.error("metadata 'format' is '" + format + "', expected '" + kFormat + "'");

  // Tensors first: a truncated file is reported as such, not as a checksum mismatch.
  const auto losses = f.tensor("losses", "F64");
  const auto params = f.tensor("params", "F32");
  const auto adam_m = f.tensor("adam_m", "F32");
  const auto adam_v = f.tensor("adam_v", "F32");
  for (const auto& [name, t] : {std::pair{"adam_m", adam_m}, std::pair{"adam_v", adam_v}})
    if (t.size() != params.size())
      throw f.error(std::string("tensor '") + name + "' has " + std::to_string(t.size() / 4) +
                    " elements but 'params' has " + std::to_string(params.size() / 4) +
                    " (they must match)");

  {  // checksum over the header without it and the tensor bytes
    const std::string stored = f.meta("checksum");
    json h = f.header();
    h["__metadata__"].erase("checksum");
    const std::string computed = hex64(content_hash(h, {losses, params, adam_m, adam_v}));
    if (stored != computed)
      throw f.error("checksum mismatch (stored " + stored + ", computed " + computed +
                    "): the file was modified or damaged");
  }

  auto integer = [&](const std::string& key, auto& out) {
    const std::string v = f.meta(key);
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    bool negative = false;
    if constexpr (std::is_signed_v<std::remove_reference_t<decltype(out)>>) negative = out < 0;
    if (v.empty() || ec != std::errc() || p != v.data() + v.size() || negative)
      throw f.error("metadata '" + key + "' = '" + v + "' is not a non-negative integer");
  };
  integer("step", c.step);
  integer("sampler_draws", c.sampler_draws);
  c.config_toml = f.meta("config_toml");
  c.recipe_toml = f.meta("recipe_toml");
  // Both must parse (errors name the file and the TOML key). The block kinds' checks are
  // for those who use the config (run_config_from_text), so the model-free fuzz build can
  // link this reader.
  (void)parse_run_config_text(c.config_toml, f.name() + " (metadata 'config_toml')",
                              any_block_kinds());
  (void)recipe_from_text(c.recipe_toml, f.name() + " (metadata 'recipe_toml')");
  // Every checkpoint since the hybrid model stores its block pattern; one without it was made
  // by the Llama-only version, whose recipe rules counted transformer layers (docs/models.md
  // "Models: Llama-style and the Nemotron-H hybrid").
  if (c.config_toml.find("\npattern = ") == std::string::npos)
    throw f.error("was written before the hybrid model (its config has no model.pattern): its "
                  "recipe's block rules counted transformer layers, which this version counts "
                  "as hybrid blocks, and its linears had other names; it cannot be resumed or "
                  "evaluated by this version");

  c.losses.resize(losses.size() / 8);
  std::memcpy(c.losses.data(), losses.data(), losses.size());
  if (!c.losses.empty() && c.losses.size() != static_cast<size_t>(c.step))
    throw f.error("tensor 'losses' has " + std::to_string(c.losses.size()) +
                  " elements but the checkpoint is at step " + std::to_string(c.step));
  c.params.resize(params.size() / 4);
  c.adam_m.resize(params.size() / 4);
  c.adam_v.resize(params.size() / 4);
  std::memcpy(c.params.data(), params.data(), params.size());
  std::memcpy(c.adam_m.data(), adam_m.data(), adam_m.size());
  std::memcpy(c.adam_v.data(), adam_v.data(), adam_v.size());

  auto parse = [&](const std::string& key) {
    try {
      return json::parse(f.meta(key));
    } catch (const json::exception& e) {
      throw f.error("metadata '" + key + "' is not JSON (" + e.what() + ")");
    }
  };
  const json refs = parse("references");
  if (!refs.is_array()) throw f.error("metadata 'references' is not a JSON array");
  // An integer field of a JSON object, checked before any conversion: nlohmann's get<int>()
  // of a non-integer number (1e300) is an out-of-range float-to-int conversion (undefined
  // behaviour), and of a too-large integer wraps (4294967297 read as 1).
  auto integer_field = [&](const json& obj, const char* key, int64_t lo, int64_t hi,
                           const std::string& where) -> int64_t {
    const auto it = obj.find(key);
    if (it == obj.end()) throw f.error(where + ": field '" + key + "' is missing");
    bool in_range = false;  // (0 <= hi)
    if (it->is_number_unsigned()) {
      const uint64_t v = it->get<uint64_t>();
      in_range = v <= static_cast<uint64_t>(hi) && static_cast<int64_t>(v) >= lo;
    } else if (it->is_number_integer()) {
      const int64_t v = it->get<int64_t>();
      in_range = v >= lo && v <= hi;
    }
    if (!in_range)
      throw f.error(where + ": '" + key + "' = " + it->dump() + " is not an integer in [" +
                    std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return it->get<int64_t>();
  };
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  for (size_t i = 0; i < refs.size(); ++i) {
    const json& r = refs[i];
    const std::string where = "metadata 'references' entry " + std::to_string(i);
    if (!r.is_object()) throw f.error(where + " is not a JSON object");
    HeldReference h;
    double held = 0;
    try {
      h.linear = r.at("linear").get<std::string>();
      h.has_value = r.at("has_value").get<bool>();
      held = r.at("held").get<double>();
    } catch (const json::exception& e) {
      throw f.error(where + ": missing or mistyped field (" + e.what() + ")");
    }
    h.role = static_cast<int>(integer_field(r, "role", 0, 6, where));
    h.last_refresh = integer_field(r, "last_refresh", 0, c.step, where);
    // Checked as a double: converting one outside the float range is undefined behaviour.
    if (!std::isfinite(held) || held < 0 || held > std::numeric_limits<float>::max())
      throw f.error(where + ": held amax " + r.at("held").dump() + " is not a finite FP32 number >= 0");
    h.held = static_cast<float>(held);
    c.references.push_back(h);
  }

  const json t = parse("trainer");
  if (!t.is_object()) throw f.error("metadata 'trainer' is not a JSON object");
  try {
    auto real = [&](const char* k) {
      const json& v = t.at(k);
      return v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
    };
    c.train_seconds = real("train_seconds");
    c.wall_seconds = real("wall_seconds");
    c.val_nll = real("val_nll");
    c.val_nll_quant = real("val_nll_quant");
    c.telemetry_digest = t.at("telemetry_digest").get<std::string>();
    c.data_key = t.at("data_key").get<std::string>();
    c.config_name = t.at("config_name").get<std::string>();
    c.save_amax = t.at("save_amax").get<bool>();
  } catch (const json::exception& e) {
    throw f.error(std::string("metadata 'trainer': missing or mistyped field (") + e.what() + ")");
  }
  c.save_every = static_cast<int>(integer_field(t, "save_every", 0, kIntMax, "metadata 'trainer'"));
  c.keep_checkpoints = static_cast<int>(integer_field(t, "keep_checkpoints", 1, kIntMax, "metadata 'trainer'"));
  c.log_every = static_cast<int>(integer_field(t, "log_every", 1, kIntMax, "metadata 'trainer'"));
  return c;
}
}  // namespace

std::vector<fs::path> list_checkpoints(const fs::path& run_dir) {
  const fs::path dir = checkpoint_dir(run_dir);
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    int64_t step = 0;
    if (parse_step_name(it->path().filename().string(), step) && it->is_regular_file())
      found.emplace_back(step, it->path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [s, p] : found) out.push_back(p);
  return out;
}

void prune_checkpoints(const fs::path& run_dir, int keep, const std::vector<int64_t>& also_keep) {
  if (keep < 1) throw std::invalid_argument("prune_checkpoints: keep must be >= 1");
  std::vector<fs::path> all;  // the prunable ones, oldest first
  for (const fs::path& p : list_checkpoints(run_dir)) {
    int64_t step = 0;
    if (!(parse_step_name(p.filename().string(), step) &&
          std::find(also_keep.begin(), also_keep.end(), step) != also_keep.end()))
      all.push_back(p);
  }
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i], ec);
    if (ec) throw UserError("cannot remove old checkpoint " + all[i].string() + ": " + ec.message());
  }
}

Checkpoint load_newest_checkpoint(const fs::path& run_dir, fs::path* file, std::string* warn) {
  const auto all = list_checkpoints(run_dir);
  if (all.empty())
    throw UserError(run_dir.string() + ": no checkpoint (no step_*.safetensors in " +
                    checkpoint_dir(run_dir).string() + ")");
  std::string skipped;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      Checkpoint c = load_checkpoint(*it);
      if (file) *file = *it;
      if (warn && !skipped.empty())
        *warn += skipped + "warning: using the older checkpoint " + it->string() + " (step " +
                 std::to_string(c.step) + ")\n";
      return c;
    } catch (const UserError& e) {
      skipped += "warning: skipping checkpoint " + it->filename().string() +
                 ", which does not load: " + e.what() + "\n";
    }
  }
  throw UserError(run_dir.string() + ": no usable checkpoint; every one failed to load:\n" + skipped +
                  "Nothing of this run can be resumed or evaluated. To continue, train it again from "
                  "step 0 with the command that started it and another --out (or after moving " + run_dir.string() +
                  " away); its metrics.jsonl so far stays where it is.");
}

fs::path resolve_checkpoint(const fs::path& file_or_run_dir, std::string* warn) {
  std::error_code ec;
  if (fs::is_regular_file(file_or_run_dir, ec)) return file_or_run_dir;
  if (!fs::is_directory(file_or_run_dir, ec))
    throw UserError(file_or_run_dir.string() +
                    ": no such checkpoint file or run directory");
  fs::path file;
  (void)load_newest_checkpoint(file_or_run_dir, &file, warn);
  return file;
}

}  // namespace fp4
