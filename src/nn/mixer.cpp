// The registry of mixer kinds and make_mixer (fp4/nn/mixer.h).
#include "fp4/nn/mixer.h"

#include <algorithm>
#include <stdexcept>

#include "fp4/base/error.h"
#include "fp4/recipe/recipe.h"
#include "mixers.h"

namespace fp4::nn {

void Mixer::init_param(size_t i, float* w, std::mt19937_64& rng) const {
  (void)i, (void)w, (void)rng;
  throw std::logic_error("Mixer::init_param: the mixer declared a kCustom parameter but has no "
                         "initialiser for it");
}

namespace {
// The built-in kinds, one line each (their entries are in their mixers' files), then the
// registered ones. The order is that of messages and of `info`.
std::vector<MixerKind>& registry() {
  static std::vector<MixerKind> kinds = {
      mamba2_mixer_kind(),
      attention_mixer_kind(),
      mlp_mixer_kind(),
  };
  return kinds;
}
constexpr size_t kBuiltIn = 3;

std::string quoted(char c) { return std::string("'") + c + "'"; }
}  // namespace

const std::vector<MixerKind>& mixer_kinds() { return registry(); }

const MixerKind* find_mixer_kind(char symbol) {
  for (const MixerKind& k : registry())
    if (k.symbol == symbol) return &k;
  return nullptr;
}

std::string mixer_kinds_listing() {
  const std::vector<MixerKind>& ks = registry();
  std::string s;
  for (size_t i = 0; i < ks.size(); ++i) {
    if (i) s += i + 1 == ks.size() ? " and " : ", ";
    s += quoted(ks[i].symbol) + " (" + ks[i].name + ")";
  }
  return s;
}

const MixerKind& mixer_kind(char symbol) {
  if (const MixerKind* k = find_mixer_kind(symbol)) return *k;
  throw UserError("model.pattern: unknown block character " + quoted(symbol) + " (expected " +
                  mixer_kinds_listing() + ")");
}

void register_mixer_kind(MixerKind kind) {
  const unsigned char c = static_cast<unsigned char>(kind.symbol);
  if (c <= ' ' || c >= 0x7f || c == '"' || c == '\'' || c == '\\')
    throw std::invalid_argument("register_mixer_kind: the symbol must be printable ASCII, not a "
                                "space, quote or backslash");
  if (find_mixer_kind(kind.symbol))
    throw std::invalid_argument("register_mixer_kind: " + quoted(kind.symbol) + " is taken (" +
                                find_mixer_kind(kind.symbol)->name + ")");
  if (!kind.make) throw std::invalid_argument("register_mixer_kind: " + kind.name + " has no make");
  if (kind.name.empty() || kind.key.empty())
    throw std::invalid_argument("register_mixer_kind: a kind needs a name and a key");
  for (const MixerKind& k : registry())
    if (k.name == kind.name || k.key == kind.key)
      throw std::invalid_argument("register_mixer_kind: the name \"" + kind.name + "\" or key \"" +
                                  kind.key + "\" is taken by " + quoted(k.symbol) + " (" + k.name + ")");
  const std::vector<std::string>& known = linear_kinds();
  for (const std::string& l : kind.linears)
    if (std::find(known.begin(), known.end(), l) == known.end())
      throw std::invalid_argument("register_mixer_kind: " + kind.name + "'s linear \"" + l +
                                  "\" is not a recipe linear kind (linear_kinds())");
  registry().push_back(std::move(kind));
}

void unregister_mixer_kind(char symbol) {
  std::vector<MixerKind>& ks = registry();
  for (size_t i = 0; i < ks.size(); ++i)
    if (ks[i].symbol == symbol) {
      if (i < kBuiltIn)
        throw std::invalid_argument("unregister_mixer_kind: " + quoted(symbol) + " is built in");
      ks.erase(ks.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  throw std::invalid_argument("unregister_mixer_kind: no kind " + quoted(symbol));
}

void check_block_kinds(const ModelConfig& cfg, const ConfigFail& fail) {
  const std::string pat = cfg.block_pattern();
  for (size_t i = 0; i < pat.size(); ++i)
    if (!find_mixer_kind(pat[i]))
      fail("model.pattern: unknown block character " + quoted(pat[i]) + " at position " +
           std::to_string(i) + " (expected " + mixer_kinds_listing() + ")");
  for (const MixerKind& k : registry())
    if (k.check && pat.find(k.symbol) != std::string::npos) k.check(cfg, fail);
}

std::unique_ptr<Mixer> make_mixer(char symbol, const ModelConfig& cfg) {
  return mixer_kind(symbol).make(cfg);
}

int64_t block_param_count(char symbol, const ModelConfig& cfg) {
  const std::unique_ptr<Mixer> m = make_mixer(symbol, cfg);
  int64_t n = cfg.d_model;  // the block's RMSNorm weight
  for (const MixerParam& p : m->params()) n += p.rows * p.cols;
  for (const MixerLinear& l : m->linears()) n += l.in * l.out;
  return n;
}

}  // namespace fp4::nn
