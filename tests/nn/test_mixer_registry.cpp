// The mixer registry (fp4/nn/mixer.h): a new kind of block is one MixerKind entry. This test
// registers a toy kind at run time, 'R', and checks that every reader of the registry takes it
// without any other change: the config parser (pattern characters, the kind's own check and
// its name in errors), the model (parameters, forward, backward against finite differences),
// `info` (model_info's counts, equal to the built model's), and the recipe rules (the toy's
// linear is matched by kind). Also the registry's refusals and the built-in entries' linears.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fp4/base/error.h"
#include "fp4/nn/run_config.h"
#include "fp4/nn/mixer.h"
#include "fp4/nn/model.h"
#include "fp4/recipe/recipe.h"
#include "fp4/train/info.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {

// The toy mixer: y = gain ⊙ (x · Wᵀ), W [d, d] one FP4-eligible linear of kind "down_proj"
// (into the residual stream), gain [1, d] a parameter of its own initialised to 0.5.
class GainMixer final : public nn::Mixer {
 public:
  explicit GainMixer(const ModelConfig& c) : d_(c.d_model) {}
  char symbol() const override { return 'R'; }
  std::vector<nn::MixerParam> params() const override {
    return {{"gain", 1, d_, false, nn::ParamInit::kCustom}};
  }
  std::vector<nn::MixerLinear> linears() const override { return {{"down_proj", d_, d_, true}}; }
  void init_param(size_t i, float* w, std::mt19937_64& rng) const override {
    (void)i, (void)rng;
    std::fill(w, w + d_, 0.5f);
  }
  int64_t activation_floats(int64_t batch, int64_t T) const override { return batch * T * d_; }
  int64_t scratch_floats(int64_t batch, int64_t T) const override { return batch * T * d_; }
  void forward(const nn::MixerCall& c, const float* x, float* y) override {
    const int64_t BT = int64_t(c.B) * c.T;
    float* h = c.acts;
    c.linears[0].forward(x, h, BT, *c.ctx);
    const float* g = c.params[0];
    for (int64_t r = 0; r < BT; ++r)
      for (int64_t j = 0; j < d_; ++j) y[r * d_ + j] = g[j] * h[r * d_ + j];
  }
  void backward(const nn::MixerCall& c, const float* x, const float* dy, float* dx) override {
    (void)x;
    const int64_t BT = int64_t(c.B) * c.T;
    const float* h = c.acts;
    const float* g = c.params[0];
    float* dg = c.grads[0];
    float* dh = c.scratch;
    for (int64_t r = 0; r < BT; ++r)
      for (int64_t j = 0; j < d_; ++j) {
        dg[j] += dy[r * d_ + j] * h[r * d_ + j];
        dh[r * d_ + j] = g[j] * dy[r * d_ + j];
      }
    std::memset(dx, 0, sizeof(float) * BT * d_);
    c.linears[0].backward(dh, dx, BT, *c.ctx);
  }

 private:
  int64_t d_;
};

nn::MixerKind gain_kind() {
  nn::MixerKind k;
  k.symbol = 'R';
  k.name = "gain";
  k.key = "gain";
  k.linears = {"down_proj"};
  k.check = [](const ModelConfig& m, const nn::ConfigFail& fail) {
    if (m.d_model % 16 != 0)
      fail("model.d_model (" + std::to_string(m.d_model) + ") must be a multiple of 16 for gain blocks");
  };
  k.make = [](const ModelConfig& c) -> std::unique_ptr<nn::Mixer> { return std::make_unique<GainMixer>(c); };
  return k;
}

// Registers the toy kind for the lifetime of the object.
struct ToyKind {
  ToyKind() { nn::register_mixer_kind(gain_kind()); }
  ~ToyKind() { nn::unregister_mixer_kind('R'); }
};

fs::path config_dir() {
  return fs::temp_directory_path() / ("fp4_mixer_registry_" + std::to_string(::getpid()));
}

// Removes the configs the tests wrote.
struct CleanUp : ::testing::Environment {
  void TearDown() override { fs::remove_all(config_dir()); }
};
const auto* const kCleanUp = ::testing::AddGlobalTestEnvironment(new CleanUp);

fs::path write_config(const std::string& name, const std::string& model_lines, int d_model = 32) {
  const fs::path dir = config_dir();
  fs::create_directories(dir);
  const fs::path f = dir / name;
  std::ofstream(f) << "[model]\nvocab_size = 256\nd_model = " << d_model << "\nn_heads = 2\nmlp_hidden = 64\n"
                   << model_lines << "\n[train]\nseq_len = 8\nbatch_size = 2\nsteps = 4\nwarmup_steps = 1\n";
  return f;
}

std::string error_of(const fs::path& f) {
  try {
    (void)load_run_config(f);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(MixerRegistry, BuiltInKindsAndTheirLinears) {
  const std::vector<nn::MixerKind>& ks = nn::mixer_kinds();
  ASSERT_GE(ks.size(), 3u);
  EXPECT_EQ(ks[0].symbol, 'M');
  EXPECT_EQ(ks[1].symbol, '*');
  EXPECT_EQ(ks[2].symbol, '-');
  EXPECT_EQ(nn::mixer_kinds_listing(), "'M' (Mamba-2), '*' (attention) and '-' (MLP)");
  // Every recipe linear kind belongs to exactly one built-in mixer kind, and each entry's
  // linears are those its mixer builds, in order.
  std::vector<std::string> all;
  ModelConfig mc;
  mc.mamba_num_heads = 2;
  for (size_t i = 0; i < 3; ++i) {
    std::vector<std::string> built;
    for (const nn::MixerLinear& l : ks[i].make(mc)->linears()) built.push_back(l.kind);
    EXPECT_EQ(built, ks[i].linears) << ks[i].name;
    EXPECT_EQ(ks[i].make(mc)->symbol(), ks[i].symbol);
    all.insert(all.end(), ks[i].linears.begin(), ks[i].linears.end());
  }
  std::vector<std::string> kinds = linear_kinds();
  std::sort(all.begin(), all.end());
  std::sort(kinds.begin(), kinds.end());
  EXPECT_EQ(all, kinds);
}

TEST(MixerRegistry, RefusesTakenSymbolsUnknownLinearsAndNoFactory) {
  nn::MixerKind k = gain_kind();
  k.symbol = '*';
  EXPECT_THROW(nn::register_mixer_kind(k), std::invalid_argument);
  k = gain_kind();
  k.linears = {"gate_proj"};  // not a recipe linear kind
  EXPECT_THROW(nn::register_mixer_kind(k), std::invalid_argument);
  k = gain_kind();
  k.make = nullptr;
  EXPECT_THROW(nn::register_mixer_kind(k), std::invalid_argument);
  k = gain_kind();
  k.symbol = '"';
  EXPECT_THROW(nn::register_mixer_kind(k), std::invalid_argument);
  k = gain_kind();
  k.key = "mlp";  // info --json would write two "mlp_blocks"
  EXPECT_THROW(nn::register_mixer_kind(k), std::invalid_argument);
  k = gain_kind();
  k.name = "attention";
  EXPECT_THROW(nn::register_mixer_kind(k), std::invalid_argument);
  k = gain_kind();
  k.name.clear();
  EXPECT_THROW(nn::register_mixer_kind(k), std::invalid_argument);
  EXPECT_THROW(nn::unregister_mixer_kind('-'), std::invalid_argument);
  EXPECT_EQ(nn::find_mixer_kind('R'), nullptr);
}

TEST(MixerRegistry, ConfigParserTakesARegisteredKind) {
  const fs::path f = write_config("toy.toml", "pattern = \"R-R\"");
  // Before registration the character is refused, naming the key and the kinds there are.
  std::string e = error_of(f);
  EXPECT_NE(e.find("model.pattern"), std::string::npos) << e;
  EXPECT_NE(e.find("'-' (MLP)"), std::string::npos) << e;
  EXPECT_EQ(e.find("gain"), std::string::npos) << e;
  {
    const ToyKind toy;
    const RunConfig cfg = load_run_config(f);
    EXPECT_EQ(cfg.model.block_pattern(), "R-R");
    // The parser lists the toy kind in its pattern error ...
    e = error_of(write_config("bad.toml", "pattern = \"R-Q\""));
    EXPECT_NE(e.find("'R' (gain)"), std::string::npos) << e;
    // ... and runs its check, only where the pattern has the kind.
    e = error_of(write_config("odd.toml", "pattern = \"R-\"", 40));
    EXPECT_NE(e.find("model.d_model (40) must be a multiple of 16 for gain blocks"), std::string::npos) << e;
    EXPECT_NO_THROW(load_run_config(write_config("odd_ok.toml", "pattern = \"*-\"", 40)));
    // The resolved config round-trips.
    EXPECT_EQ(run_config_to_toml(run_config_from_text(run_config_to_toml(cfg), "x")), run_config_to_toml(cfg));
  }
  e = error_of(f);
  EXPECT_NE(e.find("model.pattern"), std::string::npos) << e;
}

// Mean cross-entropy of the model on (in, tg) against its analytic gradient: central
// differences, Richardson-extrapolated (error O(h⁴)), on a few elements of every tensor.
TEST(MixerRegistry, ToyModelTrainsAndItsGradientsMatchFiniteDifferences) {
  const ToyKind toy;
  const RunConfig cfg = load_run_config(write_config("toy_fd.toml", "pattern = \"R-R\""));
  const int B = 2, T = 8;
  nn::Model model(cfg.model, Recipe{}, B, T);
  model.init(5);
  // The toy's parameter and linear are named like the built-ins'.
  std::set<std::string> names;
  for (const nn::ParamInfo& p : model.param_infos()) names.insert(p.name);
  EXPECT_TRUE(names.count("layers.0.mixer.gain") && names.count("layers.2.mixer.down_proj") &&
              names.count("layers.1.mixer.up_proj"));
  for (const nn::ParamInfo& p : model.param_infos()) {
    if (p.name == "layers.0.mixer.gain") {
      EXPECT_EQ(model.params()[size_t(p.offset)], 0.5f);
    }
  }

  std::vector<int32_t> in(B * T), tg(B * T);
  std::mt19937 g(7);
  for (auto& t : in) t = int32_t(g() % 256);
  for (auto& t : tg) t = int32_t(g() % 256);
  nn::StepContext ctx;
  model.zero_grad();
  const double l0 = model.forward(in.data(), tg.data(), B, ctx);
  EXPECT_TRUE(std::isfinite(l0));
  model.backward(ctx);
  const std::vector<float> grad = model.grads();
  std::vector<float>& p = model.params();
  auto loss = [&] { return model.forward(in.data(), tg.data(), B, ctx); };
  int checked = 0;
  for (const nn::ParamInfo& info : model.param_infos()) {
    for (int k = 0; k < 4; ++k) {
      const size_t i = size_t(info.offset) + size_t((k * 7919) % info.size);
      const float s = p[i];
      const float h = 3e-3f;
      auto central = [&](float step) {
        p[i] = s + step;
        const double lp = loss();
        p[i] = s - step;
        const double lm = loss();
        p[i] = s;
        return (lp - lm) / (double(s + step) - double(s - step));
      };
      const double fd = (4.0 * central(h) - central(2.0f * h)) / 3.0;
      EXPECT_NEAR(fd, grad[i], 2e-2 * std::fabs(grad[i]) + 1e-4) << info.name << " element " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * int(model.param_infos().size()));
}

// Built without the parser (a program's own ModelConfig), the model and info still run the
// kind's check.
TEST(MixerRegistry, ModelAndInfoRunTheKindsCheckWithoutTheParser) {
  const ToyKind toy;
  RunConfig cfg = load_run_config(write_config("toy_ok.toml", "pattern = \"R-\""));
  cfg.model.d_model = 40;
  try {
    nn::Model model(cfg.model, Recipe{}, 1, 8);
    ADD_FAILURE() << "a d_model of 40 was accepted for gain blocks";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model: model.d_model (40) must be a multiple of 16"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(model_info(cfg, Recipe{}), UserError);
  cfg.model.pattern = "-*";  // no gain block: the check does not apply
  EXPECT_NO_THROW(nn::Model(cfg.model, Recipe{}, 1, 8));
}

TEST(MixerRegistry, InfoCountsTheToyKindAsTheBuiltModelHasIt) {
  const ToyKind toy;
  const RunConfig cfg = load_run_config(write_config("toy_info.toml", "pattern = \"R-R\""));
  const Recipe fp4 = load_recipe("ue5m3-b16", fs::path(FP4_SOURCE_DIR) / "configs/recipes");
  const ModelInfo mi = model_info(cfg, fp4);
  EXPECT_EQ(mi.kind('R').blocks, 2);
  EXPECT_EQ(mi.kind('R').name, "gain");
  EXPECT_EQ(mi.kind('R').per_block, 32 /*norm*/ + 32 /*gain*/ + 32 * 32 /*down_proj*/);
  EXPECT_EQ(mi.kind('-').blocks, 1);
  EXPECT_EQ(mi.kind('M').blocks, 0);
  nn::Model model(cfg.model, fp4, cfg.train.micro(), cfg.train.seq_len);
  EXPECT_EQ(mi.parameters, int64_t(model.num_params()));
  // The recipe rules see the toy's linear by its kind: ue5m3-b16 quantizes down_proj.
  const std::vector<LinearSite> sites = nn::Model::linear_sites(cfg.model);
  ASSERT_EQ(sites.size(), 4u);  // R: down_proj; -: up_proj, down_proj; R: down_proj
  EXPECT_EQ(sites[0].kind, "down_proj");
  EXPECT_EQ(sites[3].block, 2);
  ASSERT_EQ(mi.linears.size(), 5u);  // and lm_head
  EXPECT_EQ(mi.linears[0].name, "layers.0.mixer.down_proj");
  EXPECT_EQ(mi.linears[0].mode, model.resolved_linears().plans[0].mode);
  // FLOPs: 6N over the toy's parameters, no extra term of its own (Mixer default).
  const double VC = 256.0 * 32;
  EXPECT_DOUBLE_EQ(nn::Model::flops_per_token(cfg.model, 8), 6.0 * (double(mi.parameters) - VC));
}

}  // namespace
