// Recipe files: TOML → fp4::Recipe, strictly validated.
#include "fp4/recipe.h"

#include <cmath>
#include <sstream>

#include "fp4/checkpoint.h"
#include "fp4/error.h"
#include "toml_reader.h"

namespace fp4 {
namespace {
LinearMode parse_mode(detail::TomlReader& r, const std::string& key, const std::string& v) {
  r.choice(key, v, {"fp32", "bf16", "fp4"});
  return v == "fp32" ? LinearMode::FP32 : v == "bf16" ? LinearMode::BF16 : LinearMode::FP4;
}
Rounding parse_rounding(detail::TomlReader& r, const std::string& key, const std::string& v) {
  r.choice(key, v, {"rne", "sr8"});
  return v == "rne" ? Rounding::RNE : Rounding::SR8;
}
const char* rounding_name(Rounding m) { return m == Rounding::RNE ? "rne" : "sr8"; }
}  // namespace

const char* linear_mode_name(LinearMode m) {
  switch (m) {
    case LinearMode::FP32: return "fp32";
    case LinearMode::BF16: return "bf16";
    case LinearMode::FP4: return "fp4";
  }
  return "?";
}

LinearMode Recipe::block_mode(int b, int n_blocks) const {
  if (mode != LinearMode::FP4) return mode;
  for (int x : blocks)
    if (x == b) return high_precision_mode;
  if (final_blocks_fraction > 0) {
    int keep = static_cast<int>(std::floor(final_blocks_fraction * n_blocks + 0.5));
    if (keep < 1) keep = 1;
    if (b >= n_blocks - keep) return high_precision_mode;
  }
  return LinearMode::FP4;
}

std::string Recipe::scale_format_str() const {
  return scale_desc ? scale_desc->name : scale_format_name(scale_format);
}

namespace {
BlockQuantSpec make_spec(const Recipe& r, bool two_d, Rounding rounding) {
  BlockQuantSpec s{r.scale_format, r.block, two_d, r.scale_target, rounding};
  s.element = parse_element_format(r.element_format);
  s.scale_rule = r.scale_rule;
  s.scale_desc = r.scale_desc;
  return s;
}
}  // namespace

BlockQuantSpec Recipe::spec_x() const { return make_spec(*this, false, round_x); }
BlockQuantSpec Recipe::spec_w() const { return make_spec(*this, weight_2d, round_w); }
BlockQuantSpec Recipe::spec_dy() const { return make_spec(*this, false, round_dy); }

namespace {
// `default_name`: the name of a recipe whose file sets none (the file's stem).
Recipe parse_recipe(detail::TomlReader& r, const std::string& default_name) {
  Recipe rc;
  std::string s;
  r.get("name", rc.name);
  if (rc.name.empty()) rc.name = default_name;
  r.get("description", rc.description);
  s = linear_mode_name(rc.mode);
  r.get("linear.mode", s);
  rc.mode = parse_mode(r, "linear.mode", s);
  r.get("linear.gemm", rc.gemm);
  r.choice("linear.gemm", rc.gemm, {"decoded", "probe-matched"});

  r.get("fp4.element_format", rc.element_format);
  try {
    rc.element_format = parse_element_format(rc.element_format).name();
  } catch (const std::invalid_argument& e) {
    r.fail("fp4.element_format",
           "an element format (e2m1, e1m2, e3m0, e2m3, e3m2, e4m3, e5m2, e<E>m<M>, int4, "
           "int4-sym), got \"" + rc.element_format + "\": " + e.what());
  }
  s = rc.scale_format_str();
  r.get("fp4.scale_format", s);
  try {
    BlockQuantSpec tmp;
    set_scale_format(tmp, s);
    rc.scale_format = tmp.scale_format;
    rc.scale_desc = tmp.scale_desc;
  } catch (const std::invalid_argument& e) {
    r.fail("fp4.scale_format",
           "a block-scale format (ue5m3, ue5m3-ptx, e4m3, ue8m0, ue4m3, ue<E>m<M>), got \"" + s +
               "\": " + e.what());
  }
  s = scale_rule_name(rc.scale_rule);
  r.get("fp4.scale_rule", s);
  r.choice("fp4.scale_rule", s, {"tensor-scaled", "mx-te", "mx-ocp"});
  rc.scale_rule = parse_scale_rule(s);
  if (rc.scale_rule != ScaleRule::TensorScaled) {
    const FloatFormat& sf = rc.scale_desc ? *rc.scale_desc : scale_format_desc(rc.scale_format);
    if (sf.frac_bits != 0) {
      r.fail("fp4.scale_rule", std::string("a power-of-two scale_format (ue8m0) with \"") +
                                   scale_rule_name(rc.scale_rule) + "\", got scale_format = \"" +
                                   sf.name + "\"");
    }
  }
  r.get("fp4.block", rc.block);
  r.range("fp4.block", rc.block, 1, 256);
  r.get("fp4.weight_2d", rc.weight_2d);
  r.get("fp4.scale_target", rc.scale_target);
  r.range("fp4.scale_target", rc.scale_target, 1e-30f, 3e38f);
  r.get("fp4.amax_interval", rc.amax_interval);
  r.range("fp4.amax_interval", rc.amax_interval, 1, 1000000);
  r.get("fp4.rht_wgrad", rc.rht_wgrad);

  s = rounding_name(rc.round_x);
  r.get("rounding.x", s);
  rc.round_x = parse_rounding(r, "rounding.x", s);
  s = rounding_name(rc.round_w);
  r.get("rounding.w", s);
  rc.round_w = parse_rounding(r, "rounding.w", s);
  s = rounding_name(rc.round_dy);
  r.get("rounding.dy", s);
  rc.round_dy = parse_rounding(r, "rounding.dy", s);

  s = linear_mode_name(rc.high_precision_mode);
  r.get("high_precision.mode", s);
  r.choice("high_precision.mode", s, {"fp32", "bf16"});
  rc.high_precision_mode = parse_mode(r, "high_precision.mode", s);
  r.get("high_precision.final_blocks_fraction", rc.final_blocks_fraction);
  r.range("high_precision.final_blocks_fraction", rc.final_blocks_fraction, 0.0, 1.0);
  r.get("high_precision.blocks", rc.blocks);
  for (int b : rc.blocks) r.range("high_precision.blocks", b, 0, 1 << 20);
  r.reject_unknown();
  if (rc.rht_wgrad && rc.mode == LinearMode::FP4 && rc.block > 16 && rc.block % 16 != 0)
    r.fail("fp4.block", "a multiple of 16 when rht_wgrad = true");
  return rc;
}
}  // namespace

Recipe load_recipe_file(const std::filesystem::path& file) {
  detail::TomlReader r(file);
  return parse_recipe(r, file.stem().string());
}

// Declared in fp4/checkpoint.h.
Recipe recipe_from_text(const std::string& toml, const std::string& where) {
  detail::TomlReader r(detail::TomlReader::FromText{}, toml, where);
  return parse_recipe(r, "recipe");
}

Recipe load_recipe(const std::string& name_or_path, const std::filesystem::path& recipes_dir) {
  namespace fs = std::filesystem;
  fs::path p(name_or_path);
  if (p.extension() == ".toml" || fs::exists(p)) return load_recipe_file(p);
  fs::path f = recipes_dir / (name_or_path + ".toml");
  if (fs::exists(f)) return load_recipe_file(f);
  std::string names;
  if (fs::is_directory(recipes_dir))
    for (auto& e : fs::directory_iterator(recipes_dir))
      if (e.path().extension() == ".toml") names += " " + e.path().stem().string();
  throw UserError("unknown recipe '" + name_or_path + "' (no file " + f.string() +
                  "); available:" + (names.empty() ? " none found" : names));
}

std::string recipe_to_toml(const Recipe& r) {
  std::ostringstream o;
  o.precision(10);
  o << "name = " << detail::toml_quote(r.name) << "\n";
  o << "description = " << detail::toml_quote(r.description) << "\n";
  o << "[linear]\nmode = \"" << linear_mode_name(r.mode) << "\"\ngemm = \"" << r.gemm << "\"\n";
  o << "[fp4]\nelement_format = \"" << r.element_format << "\"\nscale_format = \""
    << r.scale_format_str() << "\"\nscale_rule = \"" << scale_rule_name(r.scale_rule)
    << "\"\nblock = " << r.block
    << "\nweight_2d = " << (r.weight_2d ? "true" : "false") << "\nscale_target = " << r.scale_target
    << "\namax_interval = " << r.amax_interval << "\nrht_wgrad = " << (r.rht_wgrad ? "true" : "false")
    << "\n";
  o << "[rounding]\nx = \"" << rounding_name(r.round_x) << "\"\nw = \"" << rounding_name(r.round_w)
    << "\"\ndy = \"" << rounding_name(r.round_dy) << "\"\n";
  o << "[high_precision]\nmode = \"" << linear_mode_name(r.high_precision_mode)
    << "\"\nfinal_blocks_fraction = " << r.final_blocks_fraction << "\nblocks = [";
  for (size_t i = 0; i < r.blocks.size(); ++i) o << (i ? ", " : "") << r.blocks[i];
  o << "]\n";
  return o.str();
}

}  // namespace fp4
