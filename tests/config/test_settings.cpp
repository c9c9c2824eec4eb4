// `--set KEY=VALUE` overrides (fp4/config/settings.h): the parser's errors, and applying settings to
// run configs and recipes with exactly the validation of the files themselves.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "fp4/train/checkpoint.h"
#include "fp4/nn/run_config.h"
#include "fp4/base/error.h"
#include "fp4/recipe/recipe.h"
#include "fp4/config/settings.h"

using namespace fp4;
namespace fs = std::filesystem;

namespace {
const fs::path kSrc = FP4_SOURCE_DIR;
const fs::path kRecipes = kSrc / "configs/recipes";
const fs::path kTiny = kSrc / "configs/tiny.toml";

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

Settings S(const std::vector<std::string>& a) { return parse_settings(a); }

// A temporary directory of its own, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("fp4_settings_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return path / name;
  }
};
}  // namespace

TEST(Settings, SplitsConfigAndRecipeKeysAndParsesTomlValues) {
  const Settings s = S({"train.lr=1e-3", "fp4.block=32", "recipe.rounding.dy=rne",
                        "fp4.scale_format=\"e4m3\"", "high_precision.blocks=[0, 1]",
                        "fp4.rht_wgrad=true", "data.path=my text/dir", "recipe.name=mine"});
  ASSERT_EQ(s.config.size(), 2u);
  ASSERT_EQ(s.recipe.size(), 6u);
  EXPECT_EQ(s.config[0].key, "train.lr");
  EXPECT_EQ(s.config[0].value, "1e-3");
  EXPECT_EQ(s.config[0].arg, "--set train.lr=1e-3");
  EXPECT_EQ(s.config[1].key, "data.path");
  EXPECT_EQ(s.config[1].value, "\"my text/dir\"");  // a bare word is a string
  EXPECT_EQ(s.recipe[0].key, "fp4.block");
  EXPECT_EQ(s.recipe[1].key, "rounding.dy");  // the recipe. prefix is removed
  EXPECT_EQ(s.recipe[1].value, "\"rne\"");
  EXPECT_EQ(s.recipe[1].label, "rounding.dy=rne");
  EXPECT_EQ(s.recipe[2].value, "\"e4m3\"");
  EXPECT_EQ(s.recipe[2].label, "fp4.scale_format=e4m3");  // labels drop the quotes
  EXPECT_EQ(s.recipe[3].label, "high_precision.blocks=[0,1]");  // and whitespace
  EXPECT_EQ(s.recipe[5].key, "name");
  EXPECT_EQ(s.given.size(), 8u);
  EXPECT_EQ(s.given[1], "fp4.block=32");
  EXPECT_TRUE(S({}).empty());
}

TEST(Settings, ParserErrorsNameTheArgument) {
  auto err = [](const std::string& arg) { return error_of([&] { S({arg}); }); };
  EXPECT_NE(err("train.lr").find("--set train.lr: expected KEY=VALUE"), std::string::npos) << err("train.lr");
  EXPECT_NE(err("=3").find("--set =3: no key"), std::string::npos);
  EXPECT_NE(err("train.lr=").find("--set train.lr=: no value"), std::string::npos);
  // Unknown table: the known ones are listed.
  const std::string t = err("trian.lr=1");
  EXPECT_NE(t.find("--set trian.lr=1: unknown table 'trian'"), std::string::npos) << t;
  EXPECT_NE(t.find("model, train, data, eval, log"), std::string::npos) << t;
  EXPECT_NE(t.find("linear, fp4, rounding, high_precision, override"), std::string::npos) << t;
  EXPECT_NE(err("recipe.train.lr=1").find("unknown recipe table or key 'train'"), std::string::npos);
  EXPECT_NE(err("name=x").find("--set name=x: the recipe's top-level key 'name' is written recipe.name"),
            std::string::npos) << err("name=x");
  // A whole table, a malformed key, an index outside [[override]], a missing index.
  EXPECT_NE(err("train=1").find("'train' is a table"), std::string::npos) << err("train=1");
  EXPECT_NE(err("train..lr=1").find("malformed key"), std::string::npos);
  EXPECT_NE(err("fp4[0].block=1").find("malformed key"), std::string::npos);
  EXPECT_NE(err("fp4.block[0]=1").find("malformed key"), std::string::npos);
  EXPECT_NE(err("override[12345678901234567890].scale_target=2").find("malformed key"), std::string::npos);
  EXPECT_NE(err("override.scale_target=2").find("override[0].scale_target"), std::string::npos);
  // A value that starts like a TOML string or array must be one.
  EXPECT_NE(err("fp4.block=\"32").find("not a valid TOML value"), std::string::npos);
  EXPECT_NE(err("high_precision.blocks=[0,").find("not a valid TOML value"), std::string::npos);
}

TEST(Settings, RepeatedKeyIsRefused) {
  const std::string e = error_of([] { S({"fp4.block=32", "train.lr=1", "fp4.block=16"}); });
  EXPECT_NE(e.find("--set fp4.block=16: key 'fp4.block' is already set by --set fp4.block=32"),
            std::string::npos) << e;
  // The same key with and without the recipe. prefix is the same key.
  const std::string p = error_of([] { S({"recipe.fp4.block=32", "fp4.block=32"}); });
  EXPECT_NE(p.find("already set by --set recipe.fp4.block=32"), std::string::npos) << p;
}

TEST(Settings, ConfigValuesAreAppliedAndValidatedLikeTheFile) {
  const RunConfig base = load_run_config(kTiny);
  const RunConfig c = load_run_config(kTiny, S({"train.lr=1e-3", "model.n_layers=2",
                                               "eval.interval=7"}).config);
  EXPECT_EQ(c.train.lr, 1e-3);
  EXPECT_EQ(c.model.n_layers, 2);
  EXPECT_EQ(c.eval.interval, 7);
  EXPECT_EQ(c.model.d_model, base.model.d_model);  // the rest is the file's
  // The resolved TOML holds the override, and reloads to the same config.
  const std::string toml = run_config_to_toml(c);
  EXPECT_NE(toml.find("lr = 0.001\n"), std::string::npos) << toml;
  EXPECT_NE(toml.find("pattern = \"*-*-\"\n"), std::string::npos) << toml;  // 2 layers
  EXPECT_EQ(run_config_to_toml(run_config_from_text(toml, "x")), toml);
  // A pattern given with --set replaces the file's n_layers; both in --set conflict.
  const RunConfig h = load_run_config(kTiny, S({"model.pattern=\"-*-\""}).config);
  EXPECT_EQ(h.model.block_pattern(), "-*-");
  EXPECT_NE(error_of([] { load_run_config(kTiny, S({"model.pattern=\"-*\"", "model.n_layers=3"}).config); })
                .find("model.n_layers"),
            std::string::npos);

  // The same bad value in a file and in --set: the same message after the source.
  TempDir tmp;
  auto same_error = [&](const std::string& table, const std::string& key, const std::string& v) {
    const fs::path f = tmp.write("c.toml", "[" + table + "]\n" + key + " = " + v + "\n");
    const std::string file_err = error_of([&] { load_run_config(f); });
    const std::string set = table + "." + key + "=" + v;
    const std::string set_err = error_of([&] { load_run_config(kTiny, S({set}).config); });
    EXPECT_EQ(file_err.rfind(f.string() + ": ", 0), 0u) << file_err;
    EXPECT_EQ(set_err.rfind("--set " + set + ": ", 0), 0u) << set_err;
    EXPECT_EQ(file_err.substr(f.string().size()), set_err.substr(("--set " + set).size()));
    return set_err;
  };
  EXPECT_NE(same_error("train", "lr", "\"fast\"").find("key 'train.lr': expected a number"),
            std::string::npos);
  EXPECT_NE(same_error("train", "steps", "2.5").find("expected an integer"), std::string::npos);
  EXPECT_NE(same_error("train", "beta1", "1.5").find("expected a value in [0, 0.999999], got 1.5"),
            std::string::npos);
  EXPECT_NE(same_error("model", "mlp", "\"gelu\"").find("one of \"squared_relu\", \"swiglu\""),
            std::string::npos);
  EXPECT_NE(same_error("train", "lrr", "1").find("unknown key 'train.lrr'"), std::string::npos);
  // A bare word where a number belongs is a string, and is refused as one.
  EXPECT_NE(error_of([] { load_run_config(kTiny, S({"train.lr=fast"}).config); })
                .find("--set train.lr=fast: key 'train.lr': expected a number"),
            std::string::npos);
  // Unknown keys list the table's keys.
  EXPECT_NE(error_of([] { load_run_config(kTiny, S({"train.lrr=1"}).config); })
                .find("(keys of [train]: batch_size, beta1,"),
            std::string::npos);
  // A key below a value is refused.
  EXPECT_NE(error_of([] { load_run_config(kTiny, S({"train.lr.x=1"}).config); })
                .find("--set train.lr.x=1: 'train.lr' is not a table"),
            std::string::npos);
  // Cross-key checks name the file and the settings.
  const std::string x = error_of([] { load_run_config(kTiny, S({"model.n_heads=3"}).config); });
  EXPECT_NE(x.find("tiny.toml with --set model.n_heads=3: model.d_model (256) must be divisible"),
            std::string::npos) << x;
  // An error in the file itself still names the file, not a --set.
  const fs::path bad = tmp.write("bad.toml", "[train]\nlr = \"x\"\n");
  EXPECT_EQ(error_of([&] { load_run_config(bad, S({"train.steps=3"}).config); })
                .rfind(bad.string() + ": key 'train.lr'", 0),
            0u);
}

TEST(Settings, RecipeValuesAreAppliedValidatedAndTheNameLabelled) {
  const Recipe r = load_recipe("ue5m3-b16", kRecipes,
                               S({"fp4.block=32", "rounding.dy=rne", "train.lr=1"}).recipe);
  EXPECT_EQ(r.block, 32);
  EXPECT_EQ(r.round_dy, Rounding::RNE);
  EXPECT_EQ(r.amax_interval, 50);  // the file's
  EXPECT_EQ(r.name, "ue5m3-b16+fp4.block=32+rounding.dy=rne");
  const std::string toml = recipe_to_toml(r);
  EXPECT_NE(toml.find("name = \"ue5m3-b16+fp4.block=32+rounding.dy=rne\"\n"), std::string::npos);
  EXPECT_NE(toml.find("block = 32\n"), std::string::npos);
  EXPECT_NE(toml.find("dy = \"rne\"\n"), std::string::npos);
  // Reloaded as the run's recipe.toml, it is the same recipe under the same name.
  EXPECT_EQ(recipe_to_toml(recipe_from_text(toml, "recipe.toml")), toml);
  // Without settings: the file's name.
  EXPECT_EQ(load_recipe("ue5m3-b16", kRecipes).name, "ue5m3-b16");
  // A key the file lacks (its default) is set too, and tables are created.
  const Recipe f = load_recipe("fp32", kRecipes, S({"fp4.scale_format=e4m3"}).recipe);
  EXPECT_EQ(f.scale_format, ScaleFormat::E4M3);
  EXPECT_EQ(f.name, "fp32+fp4.scale_format=e4m3");
  // recipe.name names it exactly; a description changes no name.
  EXPECT_EQ(load_recipe("ue5m3-b16", kRecipes, S({"recipe.name=mine", "fp4.block=32"}).recipe).name,
            "mine");
  EXPECT_EQ(load_recipe("ue5m3-b16", kRecipes, S({"recipe.description=x"}).recipe).name,
            "ue5m3-b16");
  // An existing [[override]] table's key.
  const Recipe t = load_recipe("ue5m3-b16-t2048", kRecipes, S({"override[0].scale_target=1024"}).recipe);
  ASSERT_EQ(t.overrides.size(), 1u);
  EXPECT_EQ(t.overrides[0].scale_target, 1024.f);
  EXPECT_EQ(t.name, "ue5m3-b16-t2048+override[0].scale_target=1024");
}

TEST(Settings, RecipeErrorsNameTheArgument) {
  auto err = [](const std::string& recipe, const std::vector<std::string>& sets) {
    return error_of([&] { load_recipe(recipe, kRecipes, S(sets).recipe); });
  };
  EXPECT_EQ(err("ue5m3-b16", {"fp4.block=0"}),
            "--set fp4.block=0: key 'fp4.block': expected a value in [1, 256], got 0");
  EXPECT_EQ(err("ue5m3-b16", {"fp4.block=\"32\""}),
            "--set fp4.block=\"32\": key 'fp4.block': expected an integer");
  EXPECT_EQ(err("ue5m3-b16", {"fp4.rht_wgrad=1"}),
            "--set fp4.rht_wgrad=1: key 'fp4.rht_wgrad': expected a boolean (true/false)");
  EXPECT_NE(err("ue5m3-b16", {"rounding.dy=sr"}).find("--set rounding.dy=sr: key 'rounding.dy': "
                                                       "expected one of \"rne\", \"sr8\", \"rna\", got \"sr\""),
            std::string::npos);
  const std::string u = err("ue5m3-b16", {"fp4.blk=3"});
  EXPECT_EQ(u.rfind("--set fp4.blk=3: unknown key 'fp4.blk' (keys of [fp4]: amax_interval, ", 0), 0u) << u;
  EXPECT_NE(u.find(" block, "), std::string::npos) << u;
  EXPECT_NE(u.find(" scale_target, "), std::string::npos) << u;
  EXPECT_NE(err("ue5m3-b16", {"override[0].scale_target=2"}).find(
                "--set override[0].scale_target=2: " + (kRecipes / "ue5m3-b16.toml").string() +
                " has 0 [[override]] tables"),
            std::string::npos);
  EXPECT_NE(err("ue5m3-b16-t2048", {"override[1].scale_target=2"}).find("has 1 [[override]] table (0..0)"),
            std::string::npos);
  EXPECT_NE(err("ue5m3-b16-t2048", {"override[0].scale_targt=2"}).find(
                "--set override[0].scale_targt=2: unknown key 'override[0].scale_targt'"),
            std::string::npos);
  // A cross-key rule met by the override names the key's --set.
  EXPECT_NE(err("nvfp4-te", {"fp4.block=24"}).find("--set fp4.block=24: key 'fp4.block': expected "
                                                    "16 or less, or a multiple of 16, when "
                                                    "rht_wgrad = true"),
            std::string::npos);
  // Rules checked against the model name the recipe source with its settings.
  const Recipe big = load_recipe("ue5m3-b16", kRecipes, S({"high_precision.final_blocks=9"}).recipe);
  const std::string fit = error_of([&] { resolve_linear_plans(big, llama_linear_sites(4), 8); });
  EXPECT_NE(fit.find("ue5m3-b16.toml with --set high_precision.final_blocks=9)"), std::string::npos) << fit;
}

TEST(Settings, LabelsAndSources) {
  const Settings s = S({"fp4.block=32", "rounding.dy=\"rne\""});
  EXPECT_EQ(labelled_name("x", s.recipe), "x+fp4.block=32+rounding.dy=rne");
  EXPECT_EQ(labelled_name("x", {}), "x");
  EXPECT_EQ(with_settings("f.toml", s.recipe), "f.toml with --set fp4.block=32 --set rounding.dy=\"rne\"");
  EXPECT_EQ(with_settings("f.toml", {}), "f.toml");
}
