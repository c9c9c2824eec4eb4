// Comparison-report arithmetic against hand-computed values (the definitions of docs/compare.md
// "Comparing recipes: `fp4train compare`").
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <unistd.h>

#include "fp4/data/data.h"
#include "fp4/base/error.h"
#include "fp4/study/report.h"

using namespace fp4;
namespace fs = std::filesystem;

TEST(Report, MedianAndMeanStd) {
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_TRUE(std::isnan(median({})));
  const MeanStd m = mean_std({1, 2, 3, 4});
  EXPECT_DOUBLE_EQ(m.mean, 2.5);
  EXPECT_DOUBLE_EQ(m.std, std::sqrt(5.0 / 3));  // Σ(x−2.5)² = 5, n − 1 = 3
  EXPECT_EQ(mean_std({7}).std, 0);
}

TEST(Report, LossSpikesAgainstTheRunningMedian) {
  // Previous-window medians: i=1: 5 → 5.4 not > 5.5; i=2: median(5, 5.4) = 5.2 → 5.8 > 5.7 spike;
  // i=3: median(5, 5.4, 5.8) = 5.4 → 5.0 no; i=4: NaN counts.
  EXPECT_EQ(count_loss_spikes({5.0, 5.4, 5.8, 5.0, NAN}), 2);
  // With a window of 1 only the previous value matters: 5.0 → 5.6 is a spike, 5.6 → 6.0 not.
  EXPECT_EQ(count_loss_spikes({5.0, 5.6, 6.0}, 1), 1);
  EXPECT_EQ(count_loss_spikes({5.0, 5.6, 6.0}, 100), 2);  // 6.0 vs median(5.0, 5.6) = 5.3
  EXPECT_EQ(count_loss_spikes({}), 0);
  // Exactly +0.5 is not "more than 0.5".
  EXPECT_EQ(count_loss_spikes({1.0, 1.5}), 0);
}

namespace {
RunRecord run(const std::string& recipe, double loss, double ms, double gn_late) {
  RunRecord r;
  r.recipe = recipe;
  r.final_window_loss = loss;
  r.tokens_per_step = 100;
  r.warmup_steps = 2;
  for (int s = 1; s <= 10; ++s) {
    r.step.push_back(s);
    r.loss.push_back(6.0 - 0.1 * s);
    r.grad_norm.push_back(s <= 2 ? 99.0 : (s == 7 ? gn_late : 0.5));  // warmup excursion ignored
    r.step_ms.push_back(s <= 5 ? 1000.0 : ms);  // the first 5 steps are ignored
  }
  r.heldout["none"] = loss + 0.1;
  return r;
}
}  // namespace

TEST(Report, AggregateGapsRatiosAndGradNorms) {
  const std::vector<RunRecord> runs = {run("fp32", 5.0, 10, 1), run("bf16", 4.0, 20, 2),
                                       run("bf16", 6.0, 20, 3), run("x", 5.5, 30, 4)};
  const auto rows = aggregate_runs(runs, {"bf16", "fp32"});
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].recipe, "bf16");
  EXPECT_EQ(rows[2].recipe, "x");  // not in the order: appended
  EXPECT_EQ(rows[0].seeds, 2);
  EXPECT_DOUBLE_EQ(rows[0].final_loss.mean, 5.0);
  EXPECT_DOUBLE_EQ(rows[0].final_loss.std, std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(rows[1].gap_to_baseline_pct, 0.0);
  EXPECT_DOUBLE_EQ(rows[2].gap_to_baseline_pct, 10.0);  // (5.5 − 5) / 5
  EXPECT_DOUBLE_EQ(rows[0].step_ratio_fp32, 2.0);
  EXPECT_DOUBLE_EQ(rows[2].step_ratio_fp32, 3.0);
  EXPECT_DOUBLE_EQ(rows[0].max_grad_norm, 3.0);
  EXPECT_DOUBLE_EQ(rows[0].heldout.at("none").mean, 5.1);
  EXPECT_DOUBLE_EQ(rows[0].tokens_per_s, 100 * 1000 / 20.0);  // tokens per step / median ms
  const std::string md = comparison_report_md(rows, runs, ReportContext{});
  EXPECT_NE(md.find("| x | 1 | 5.5000 | +10.00% |"), std::string::npos) << md;
  EXPECT_NE(md.find("| bf16 | 2 | 5.0000 ± 1.4142 | +0.00% |"), std::string::npos) << md;
  // All these runs have seed 0; of the two bf16 runs of that seed the later one (6.0) is the
  // pair of x (5.5).
  EXPECT_DOUBLE_EQ(rows[2].paired_delta_baseline.mean, -0.5);
}

// Step-time ratios that are not measurements are marked: fewer than 10 timed steps, a run on a
// busy machine, an interquartile spread above half the median, and fp32's own marks on every
// ratio to it. run() gives 5 timed steps (6..10) per run.
TEST(Report, UnreliableStepTimesAreMarked) {
  std::vector<RunRecord> runs = {run("fp32", 5.0, 10, 1), run("fp32", 5.0, 10, 1),
                                 run("a", 5.0, 20, 1), run("a", 5.0, 20, 1),
                                 run("b", 5.0, 30, 1)};
  runs[3].busy_machine = true;
  // b: steps 6..10 at 10, 10, 30, 50, 50 ms: median 30, quartiles 10 and 50 → spread 133%.
  runs[4].step_ms = {1000, 1000, 1000, 1000, 1000, 10, 10, 30, 50, 50};
  const auto rows = aggregate_runs(runs, {"fp32", "a", "b"});
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].timed_steps, 10);
  EXPECT_EQ(rows[0].timing_note, "");  // 10 steps, no spread, quiet
  EXPECT_EQ(rows[1].busy_runs, 1);
  EXPECT_EQ(rows[1].timing_note, "busy machine");
  EXPECT_DOUBLE_EQ(rows[2].step_spread, 40.0 / 30.0);
  EXPECT_EQ(rows[2].timing_note, "5 steps, spread 133%");
  const std::string md = comparison_report_md(rows, runs, ReportContext{});
  EXPECT_NE(md.find("| 2.00× (busy machine) |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 3.00× (5 steps, spread 133%) |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 1.00× |"), std::string::npos) << md;
  // A marked reference marks every ratio to it.
  runs[0].busy_machine = true;
  const auto rows2 = aggregate_runs(runs, {"fp32", "a", "b"});
  EXPECT_EQ(rows2[0].timing_note, "busy machine");
  EXPECT_EQ(rows2[1].timing_note, "busy machine; fp32: busy machine");
}

// A run that took a slow quantizer path (summary.json slow_path) marks its recipe's ratio
// "slow path", and not "busy machine" even when the machine was busy too: the recipe explains
// the time (docs/performance.md "Block sizes and the quantizer's fast path").
TEST(Report, SlowQuantizerPathIsMarkedNotBlamedOnTheMachine) {
  std::vector<RunRecord> runs = {run("fp32", 5.0, 10, 1), run("fp32", 5.0, 10, 1),
                                 run("a", 5.0, 20, 1), run("a", 5.0, 20, 1)};
  for (auto& r : runs)  // steps 11..20 too: 15 timed steps, so no "5 steps" mark
    for (int st = 11; st <= 20; ++st) r.step.push_back(st), r.step_ms.push_back(r.step_ms.back());
  runs[2].busy_machine = true;
  runs[3].slow_path = "scalar reference quantizer (scale format ue4m3 has no SIMD kernel): fprop x";
  const auto rows = aggregate_runs(runs, {"fp32", "a"});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].slow_path_runs, 1);
  EXPECT_EQ(rows[1].timing_note, "slow path");
  EXPECT_EQ(rows[0].timing_note, "");
  const std::string md = comparison_report_md(rows, runs, ReportContext{});
  EXPECT_NE(md.find("| 2.00× (slow path) |"), std::string::npos) << md;
  EXPECT_NE(md.find("*slow path* (a run's quantizers took a path slower"), std::string::npos) << md;
  // read_run takes it from summary.json
  const fs::path d = fs::temp_directory_path() / ("fp4_report_slow_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d / "summary.json") << R"({"status":"completed","recipe":"a","seed":3,"steps":2,
    "final_window_loss":5.5,"tokens_per_s":10,"heldout_nll":5.6,"heldout_nll_quant":5.6,
    "slow_path":"scalar reference quantizer (forced by a test hook): fprop x"})";
  std::ofstream(d / "metrics.jsonl") << "{\"step\":1,\"loss\":6,\"grad_norm\":1}\n";
  EXPECT_EQ(read_run(d).slow_path, "scalar reference quantizer (forced by a test hook): fprop x");
  fs::remove_all(d);
}

TEST(Report, AggregateWithoutBaselinesGivesDashes) {
  const auto rows = aggregate_runs({run("a", 5.0, 10, 1)}, {});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(std::isnan(rows[0].gap_to_baseline_pct));
  EXPECT_TRUE(std::isnan(rows[0].step_ratio_fp32));
  const std::string md = comparison_report_md(rows, {}, ReportContext{});
  EXPECT_NE(md.find("| a | 1 | 5.0000 | — |"), std::string::npos) << md;
}

// read_run(d) throws a UserError whose message contains `needle`.
static void expect_read_run_error(const fs::path& d, const std::string& needle) {
  try {
    read_run(d);
    ADD_FAILURE() << "no error, expected one containing " << needle;
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Report, ReadRunRejectsUnfinishedAndMalformedRuns) {
  const fs::path d = fs::temp_directory_path() / ("fp4_report_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  auto expect_error = [&](const std::string& needle) { expect_read_run_error(d, needle); };
  expect_error("did not complete");
  std::ofstream(d / "summary.json") << R"({"status":"completed","recipe":"fp32","seed":3,"steps":2,
    "final_window_loss":5.5,"tokens_per_s":10,"heldout_nll":5.6,"heldout_nll_quant":5.6})";
  expect_error("metrics.jsonl");
  std::ofstream(d / "metrics.jsonl") << "{\"step\":1,\"loss\":6,\"grad_norm\":1}\n{\"step\":2,\"loss\":";
  expect_error("metrics.jsonl:2");
  std::ofstream(d / "metrics.jsonl") << "{\"step\":2,\"loss\":6,\"grad_norm\":1}\n{\"step\":1,\"loss\":5,\"grad_norm\":1}\n";
  expect_error("not increasing");
  std::ofstream(d / "metrics.jsonl") << "{\"step\":1,\"loss\":6,\"grad_norm\":1}\n{\"step\":2,\"loss\":null,\"grad_norm\":1}\n";
  const RunRecord r = read_run(d);
  EXPECT_EQ(r.seed, 3u);
  EXPECT_EQ(r.final_window_steps, 1);  // no final_window_steps: max(1, 2 / 10), the old rule
  EXPECT_EQ(r.loss.size(), 2u);
  EXPECT_TRUE(std::isnan(r.loss[1]));  // a NaN written as null is read back as NaN
  EXPECT_EQ(r.heldout.count("current"), 0u);  // fp32 has no quantized inference
  EXPECT_DOUBLE_EQ(r.heldout.at("none"), 5.6);
  // eval.json (`fp4train eval --json`) replaces the summary's two values when present.
  std::ofstream(d / "eval.json") << R"({"policies":["none","replay-d50"],"results":{
    "none":{"nats_per_token":5.25,"bits_per_byte":1.5},"replay-d50":{"nats_per_token":null}}})";
  const RunRecord e = read_run(d);
  EXPECT_DOUBLE_EQ(e.heldout.at("none"), 5.25);
  EXPECT_DOUBLE_EQ(e.heldout_bpb.at("none"), 1.5);
  EXPECT_TRUE(std::isnan(e.heldout.at("replay-d50")));
  std::ofstream(d / "eval.json") << R"({"policies":{}})";
  expect_error("eval.json");
  fs::remove(d / "eval.json");
  EXPECT_FALSE(read_run(d).busy_machine);  // a summary without machine_load
  std::ofstream(d / "summary.json") << R"({"status":"completed","recipe":"fp32","seed":3,"steps":2,
    "final_window_loss":5.5,"tokens_per_s":10,"heldout_nll":5.6,"heldout_nll_quant":5.6,
    "machine_load":{"max_load1":3.1,"cores":2,"threads":2,"busy":true}})";
  EXPECT_TRUE(read_run(d).busy_machine);
  fs::remove_all(d);
}

// The definition of the final-window loss names the window the runs used (summary.json
// final_window_steps of steps), not a fixed 10%.
TEST(Report, FinalWindowDefinitionNamesTheWindowUsed) {
  const fs::path d = fs::temp_directory_path() / ("fp4_report_fw_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d / "summary.json") << R"({"status":"completed","recipe":"fp32","seed":1,"steps":30000,
    "final_window_loss":2.5,"final_window_steps":250,"tokens_per_s":10,"heldout_nll":2.6,"heldout_nll_quant":2.6})";
  std::ofstream(d / "metrics.jsonl") << "{\"step\":1,\"loss\":6,\"grad_norm\":1}\n";
  RunRecord a = read_run(d);
  fs::remove_all(d);
  EXPECT_EQ(a.final_window_steps, 250);
  EXPECT_EQ(a.steps, 30000);
  auto definition = [](const std::vector<RunRecord>& runs) {
    const std::string md = comparison_report_md(aggregate_runs(runs, {"fp32"}), runs, ReportContext{});
    const size_t at = md.find("* **Final-window loss**: ");
    EXPECT_NE(at, std::string::npos) << md;
    return md.substr(at, md.find('\n', at) - at);
  };
  // 250 of 30,000 steps: 0.833%.
  EXPECT_EQ(definition({a}),
            "* **Final-window loss**: mean training loss over the last 250 of 30000 steps (0.833%) "
            "of each run (`train.final_window`; by default the last 10% of the steps).");
  RunRecord b = a, c = a;
  b.final_window_steps = 20;
  b.steps = 200;
  c.final_window_steps = 20;
  c.steps = 200;
  EXPECT_EQ(definition({b, c}),
            "* **Final-window loss**: mean training loss over the last 20 of 200 steps (10%) of "
            "each run (`train.final_window`; by default the last 10% of the steps).");
  EXPECT_EQ(definition({a, b, c}),
            "* **Final-window loss**: mean training loss over the last steps of a run "
            "(`train.final_window`; by default the last 10% of the steps); here the last 20 of "
            "200 steps (10%) in 2 runs, 250 of 30000 steps (0.833%) in 1 run.");
  // A diverged run has no window; with no completed run the definition names no numbers.
  RunRecord dv = b;
  dv.diverged_at = 7;
  dv.final_window_steps = 0;
  EXPECT_EQ(definition({dv}),
            "* **Final-window loss**: mean training loss over the last steps of a run "
            "(`train.final_window`; by default the last 10% of the steps).");
}

TEST(Report, DivergedRunsAreCountedNotAveraged) {
  RunRecord d = run("nvfp4-all", 0, 10, 1);
  d.diverged_at = 7;
  d.final_window_loss = NAN;
  d.heldout.clear();
  RunRecord ok = run("nvfp4-all", 5.0, 10, 1);
  ok.heldout["current"] = 5.2;  // only this seed has `current`
  RunRecord ok2 = run("nvfp4-all", 6.0, 10, 1);
  const std::vector<RunRecord> runs = {d, ok, ok2};
  const auto rows = aggregate_runs(runs, {});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].seeds, 2);
  EXPECT_EQ(rows[0].diverged, 1);
  EXPECT_DOUBLE_EQ(rows[0].final_loss.mean, 5.5);  // the diverged seed is not averaged
  const std::string md = comparison_report_md(rows, runs, ReportContext{});
  EXPECT_NE(md.find("| at step 7 |"), std::string::npos) << md;
  EXPECT_NE(md.find("diverged at step 7"), std::string::npos) << md;  // per-run table
  EXPECT_NE(md.find("5.2000 (n=1)"), std::string::npos) << md;  // 1 of 2 completed seeds
}

TEST(Report, ReadRunOfADivergedRun) {
  const fs::path d = fs::temp_directory_path() / ("fp4_report_div_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d / "error.txt") << "non-finite training loss (nan) at step 13 with recipe x; the run diverged.\n";
  std::ofstream(d / "metrics.jsonl") << "{\"step\":1,\"loss\":6,\"grad_norm\":1}\n";
  std::ofstream(d / "config.toml") << "[train]\nseed = 4\nsteps = 20\nwarmup_steps = 2\n";
  std::ofstream(d / "recipe.toml") << "name = \"wild\"\n";
  const RunRecord r = read_run(d);
  EXPECT_EQ(r.diverged_at, 13);
  EXPECT_EQ(r.recipe, "wild");
  EXPECT_EQ(r.seed, 4u);
  EXPECT_TRUE(r.heldout.empty());
  fs::remove_all(d);
}

TEST(Report, AFailedRunIsNotADivergence) {
  // error.txt of a run that could not be carried out (fp4::train's "failed ..." line) is not a
  // result: read_run refuses it as not completed instead of reporting a divergence at step 1.
  const fs::path d = fs::temp_directory_path() / ("fp4_report_fail_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d / "error.txt") << "failed in step 1 of 20 (recipe bf16): oneDNN matmul failed\n";
  std::ofstream(d / "metrics.jsonl") << "";
  std::ofstream(d / "config.toml") << "[train]\nseed = 4\nsteps = 20\nwarmup_steps = 2\n";
  std::ofstream(d / "recipe.toml") << "name = \"bf16\"\n";
  EXPECT_EQ(fp4::run_error(d), fp4::RunError::Failed);
  try {
    (void)read_run(d);
    FAIL() << "a failed run must not be read as a result";
  } catch (const fp4::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("did not complete: failed in step 1"), std::string::npos)
        << e.what();
  }
  fs::remove_all(d);
}

TEST(Report, PairedDeltaToBf16UsesTheSameSeed) {
  // Seeds differ a lot (4.0 vs 6.0) but the recipe is 0.1 and 0.3 above bf16 on each: the
  // paired delta is 0.2 ± 0.1414, the unpaired spread ± 1.4.
  RunRecord b1 = run("bf16", 4.0, 10, 1), b2 = run("bf16", 6.0, 10, 1);
  RunRecord f1 = run("fp4", 4.1, 10, 1), f2 = run("fp4", 6.3, 10, 1);
  b1.seed = f1.seed = 1;
  b2.seed = f2.seed = 2;
  RunRecord lone = run("fp4", 9.0, 10, 1);
  lone.seed = 3;  // no bf16 run of seed 3: not paired
  const auto rows = aggregate_runs({b1, b2, f1, f2, lone}, {"bf16", "fp4"});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_NEAR(rows[1].paired_delta_baseline.mean, 0.2, 1e-12);
  EXPECT_NEAR(rows[1].paired_delta_baseline.std, std::sqrt(0.02), 1e-12);
  EXPECT_EQ(rows[1].paired_delta_baseline.n, 2);
  const std::string md = comparison_report_md(rows, {}, ReportContext{});
  EXPECT_NE(md.find("| +0.2000 ± 0.1414 |"), std::string::npos) << md;
  EXPECT_DOUBLE_EQ(rows[0].paired_delta_baseline.mean, 0.0);
}

TEST(Report, BaselineOtherThanBf16) {
  // fp32 4.0 / 6.0 on seeds 1 / 2, bf16 4.2 / 6.2, fp4 4.5 / 6.1. Against fp32: bf16 +0.2 on
  // both seeds (± 0), fp4 +0.5 and +0.1 → 0.3 ± sqrt(0.08) = 0.2828; gaps of the means
  // (5.0, 5.2, 5.3) to fp32's 5.0: +4% and +6%.
  RunRecord a1 = run("fp32", 4.0, 10, 1), a2 = run("fp32", 6.0, 10, 1);
  RunRecord b1 = run("bf16", 4.2, 10, 1), b2 = run("bf16", 6.2, 10, 1);
  RunRecord f1 = run("fp4", 4.5, 10, 1), f2 = run("fp4", 6.1, 10, 1);
  a1.seed = b1.seed = f1.seed = 1;
  a2.seed = b2.seed = f2.seed = 2;
  const std::vector<RunRecord> runs = {a1, a2, b1, b2, f1, f2};
  const auto rows = aggregate_runs(runs, {"fp32", "bf16", "fp4"}, "fp32");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[2].baseline, "fp32");
  EXPECT_NEAR(rows[1].gap_to_baseline_pct, 4.0, 1e-12);
  EXPECT_NEAR(rows[2].gap_to_baseline_pct, 6.0, 1e-12);
  EXPECT_NEAR(rows[1].paired_delta_baseline.mean, 0.2, 1e-12);
  EXPECT_NEAR(rows[1].paired_delta_baseline.std, 0.0, 1e-12);
  EXPECT_NEAR(rows[2].paired_delta_baseline.mean, 0.3, 1e-12);
  EXPECT_NEAR(rows[2].paired_delta_baseline.std, std::sqrt(0.08), 1e-12);
  const std::string md = comparison_report_md(rows, runs, ReportContext{});
  EXPECT_NE(md.find("| vs fp32 | Δ vs fp32, paired by seed |"), std::string::npos) << md;
  EXPECT_EQ(md.find("vs bf16"), std::string::npos) << md;
  EXPECT_NE(md.find("| fp4 | 2 | 5.3000 ± 1.1314 | +6.00% | +0.3000 ± 0.2828 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| fp32 | 2 | 5.0000 ± 1.4142 | +0.00% | +0.0000 ± 0.0000 |"), std::string::npos) << md;
  // The default is bf16 when it is compared: the same runs against bf16 (mean 5.2).
  const auto dflt = aggregate_runs(runs, {"fp32", "bf16", "fp4"});
  EXPECT_EQ(dflt[0].baseline, "bf16");
  EXPECT_NEAR(dflt[2].paired_delta_baseline.mean, 0.1, 1e-12);  // (+0.3, −0.1) / 2
  // Without bf16 it is fp32.
  const auto no_bf16 = aggregate_runs({a1, a2, f1, f2}, {});
  EXPECT_EQ(no_bf16[0].baseline, "fp32");
  EXPECT_NEAR(no_bf16[1].paired_delta_baseline.mean, 0.3, 1e-12);
}

TEST(Report, FindBaselineAcceptsLabelledNames) {
  const std::vector<std::string> names = {"fp32+fp4.block=32", "ue5m3-b16+fp4.block=32"};
  EXPECT_EQ(find_baseline(names, "fp32"), "fp32+fp4.block=32");
  EXPECT_EQ(find_baseline(names, "fp32+fp4.block=32"), "fp32+fp4.block=32");
  EXPECT_EQ(find_baseline(names, "bf16"), "");
  EXPECT_EQ(find_baseline(names, "fp3"), "");  // a prefix of a name is not the name
  EXPECT_EQ(default_baseline(names), "fp32+fp4.block=32");
  EXPECT_EQ(default_baseline({"bf16", "fp32"}), "bf16");
  EXPECT_EQ(default_baseline({"mxfp4"}), "");
  EXPECT_THROW(find_baseline({"fp32+a=1", "fp32+a=2"}, "fp32"), UserError);
  EXPECT_EQ(find_baseline({"fp32+a=1", "fp32"}, "fp32"), "fp32");  // the exact name wins
}

// Student's t 0.975 quantiles against the published table (e.g. NIST/SEMATECH e-Handbook,
// table 1.3.6.7.2) and, beyond df 30, the table's df = 40, 60, 100, 120 entries.
TEST(ReportStats, TQuantilesMatchThePublishedTable) {
  EXPECT_NEAR(t_quantile_975(1), 12.706, 5e-4);
  EXPECT_NEAR(t_quantile_975(2), 4.303, 5e-4);
  EXPECT_NEAR(t_quantile_975(3), 3.182, 5e-4);
  EXPECT_NEAR(t_quantile_975(10), 2.228, 5e-4);
  EXPECT_NEAR(t_quantile_975(30), 2.042, 5e-4);
  EXPECT_NEAR(t_quantile_975(40), 2.021, 5e-4);
  EXPECT_NEAR(t_quantile_975(60), 2.000, 5e-4);
  EXPECT_NEAR(t_quantile_975(100), 1.984, 5e-4);
  EXPECT_NEAR(t_quantile_975(120), 1.980, 5e-4);
  EXPECT_NEAR(t_quantile_975(100000), 1.960, 5e-4);
  EXPECT_TRUE(std::isnan(t_quantile_975(0)));
}

// Hand calculation. Deltas {0.10, 0.12, 0.11}: mean 0.11, std 0.01, t(2) = 4.3027, half-width
// 4.3027 · 0.01 / √3 = 0.024842 → [0.085158, 0.134842], resolved, higher. Deltas {0.1, 0.3}:
// 12.7062 · 0.141421 / √2 = 1.27062 → contains 0, not resolved. One seed: no interval.
TEST(ReportStats, PairedIntervalsAndTheirVerdicts) {
  PairedInterval c = paired_interval(mean_std({0.10, 0.12, 0.11}));
  EXPECT_NEAR(c.lo, 0.11 - 0.024842, 1e-6);
  EXPECT_NEAR(c.hi, 0.11 + 0.024842, 1e-6);
  EXPECT_TRUE(c.resolved);
  EXPECT_EQ(c.sign, 1);
  c = paired_interval(mean_std({-0.10, -0.12, -0.11}));
  EXPECT_TRUE(c.resolved);
  EXPECT_EQ(c.sign, -1);
  c = paired_interval(mean_std({0.1, 0.3}));
  EXPECT_NEAR(c.hi - c.lo, 2 * 1.27062, 1e-4);
  EXPECT_FALSE(c.resolved);
  EXPECT_EQ(c.sign, 0);
  c = paired_interval(mean_std({0.2}));
  EXPECT_FALSE(c.resolved);
  EXPECT_EQ(c.n, 1);
}

TEST(ReportStats, TheTableShowsTheIntervalAndItsVerdict) {
  RunRecord b1 = run("bf16", 4.0, 10, 1), b2 = run("bf16", 6.0, 10, 1), b3 = run("bf16", 5.0, 10, 1);
  RunRecord f1 = run("fp4", 4.10, 10, 1), f2 = run("fp4", 6.12, 10, 1), f3 = run("fp4", 5.11, 10, 1);
  RunRecord g1 = run("wide", 4.1, 10, 1), g2 = run("wide", 5.7, 10, 1), g3 = run("wide", 5.3, 10, 1);
  b1.seed = f1.seed = g1.seed = 1;
  b2.seed = f2.seed = g2.seed = 2;
  b3.seed = f3.seed = g3.seed = 3;
  const auto rows = aggregate_runs({b1, b2, b3, f1, f2, f3, g1, g2, g3}, {"bf16", "fp4", "wide"});
  const std::string md = comparison_report_md(rows, {}, ReportContext{});
  EXPECT_NE(md.find("| [+0.0852, +0.1348] higher |"), std::string::npos) << md;
  EXPECT_NE(md.find("not resolved |"), std::string::npos) << md;  // wide: +0.1, −0.3, +0.3
  EXPECT_NE(md.find("its 95% interval"), std::string::npos);
}

// One verdict per row (docs/compare.md "The report"): the t-interval over seeds decides; the
// bootstrap over windows, resolved here too, is shown without a verdict word. And the Power
// table is in every report with a baseline and 2 paired seeds, no study file needed. Hand
// calculation: deltas {0.10, 0.12, 0.11}, std 0.01; n = 18 is the first with
// t₀.₉₇₅,ₙ₋₁ · 0.01 / √n ≤ 0.005 (t(17) = 2.1098: 0.00497; t(16) = 2.1199 / √17: 0.00514);
// for ±0.01, n = 7 (2.4469 / √7 = 0.925; 2.5706 / √6 = 1.049).
TEST(ReportStats, OneVerdictPerRowAndAPowerTableWithoutHypotheses) {
  RunRecord b1 = run("bf16", 4.0, 10, 1), b2 = run("bf16", 6.0, 10, 1),
            b3 = run("bf16", 5.0, 10, 1);
  RunRecord f1 = run("fp4", 4.10, 10, 1), f2 = run("fp4", 6.12, 10, 1),
            f3 = run("fp4", 5.11, 10, 1);
  b1.seed = f1.seed = 1;
  b2.seed = f2.seed = 2;
  b3.seed = f3.seed = 3;
  for (RunRecord* r : {&b1, &b2, &b3}) r->heldout_windows["none"] = {5.0, 5.0, 5.0, 5.0};
  for (RunRecord* r : {&f1, &f2, &f3}) r->heldout_windows["none"] = {5.1, 5.2, 5.1, 5.2};
  const std::vector<RunRecord> runs = {b1, b2, b3, f1, f2, f3};
  const auto rows = aggregate_runs(runs, {"bf16", "fp4"});
  ASSERT_EQ(rows.size(), 2u);
  ASSERT_TRUE(rows[1].heldout_boot.resolved);  // the bootstrap excludes 0 as well
  const std::string md = comparison_report_md(rows, runs, ReportContext{});
  const size_t at = md.find("\n| fp4 | 3 | ");
  ASSERT_NE(at, std::string::npos) << md;
  const std::string row = md.substr(at + 1, md.find('\n', at + 1) - at - 1);
  int words = 0;
  for (const char* w : {"lower", "higher", "not resolved"})
    for (size_t p = row.find(w); p != std::string::npos; p = row.find(w, p + 1)) ++words;
  EXPECT_EQ(words, 1) << row;
  EXPECT_NE(row.find("| [+0.0852, +0.1348] higher |"), std::string::npos) << row;
  EXPECT_NE(row.find("| +0.1500 [+0.1000, +0.2000] |"), std::string::npos) << row;
  EXPECT_NE(md.find("bootstrap over windows (evaluation noise only)"), std::string::npos);
  EXPECT_EQ(md.find("## Hypotheses"), std::string::npos);
  EXPECT_NE(md.find("\n## Power\n"), std::string::npos) << md;
  EXPECT_NE(md.find("| fp4 | 3 | 0.0100 | ±0.0248 | 18 |"), std::string::npos) << md;
  ReportContext ctx;
  ctx.effect = 0.01;
  const std::string md10 = comparison_report_md(rows, runs, ctx);
  EXPECT_NE(md10.find("| fp4 | 3 | 0.0100 | ±0.0248 | 7 |"), std::string::npos) << md10;
  EXPECT_NE(md10.find("seeds for ±0.01 |"), std::string::npos) << md10;
  // One seed: no paired spread, no Power table.
  const std::string one = comparison_report_md(aggregate_runs({b1, f1}, {"bf16", "fp4"}), {b1, f1},
                                               ReportContext{});
  EXPECT_EQ(one.find("## Power"), std::string::npos) << one;
}

// Grad-norm excursions: logged steps after warmup with a norm above 1 (or not finite).
TEST(ReportStats, GradNormExcursionsAfterWarmupAreCounted) {
  RunRecord r = run("fp4", 4.0, 10, 1);
  r.warmup_steps = 3;
  ASSERT_EQ(r.grad_norm.size(), r.step.size());
  for (size_t i = 0; i < r.step.size(); ++i) r.grad_norm[i] = 0.5;
  r.grad_norm[0] = 9.0;  // step 1: inside the warmup, not counted
  r.grad_norm[5] = 1.5;
  r.grad_norm[7] = std::numeric_limits<double>::infinity();
  r.grad_norm[8] = 1.0;  // not above 1
  const auto rows = aggregate_runs({r}, {"fp4"});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].grad_norm_excursions, 2);
  const std::string md = comparison_report_md(rows, {}, ReportContext{});
  EXPECT_NE(md.find("grad norm > 1 after warmup"), std::string::npos);
}

// Paired bootstrap over windows (docs/recipes.md "Studies: claims as hypotheses"), against hand
// calculation and normal theory.
TEST(ReportBootstrap, ConstantDifferencesGiveAPointInterval) {
  const BootstrapInterval b = paired_bootstrap({std::vector<double>(8, -0.25)}, 1000);
  EXPECT_EQ(b.lo, -0.25);
  EXPECT_EQ(b.hi, -0.25);
  EXPECT_EQ(b.mean, -0.25);
  EXPECT_TRUE(b.resolved);
  EXPECT_EQ(b.sign, -1);
  EXPECT_EQ(b.windows, 8);
  EXPECT_EQ(b.resamples, 1000);
}

// Two windows {0, 1}: a resample's mean is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4, so
// with 10,000 resamples about 2,500 are 0 and 2,500 are 1: the 2.5% and 97.5% quantiles are
// exactly 0 and 1, and about a quarter of the draws are each extreme.
TEST(ReportBootstrap, TwoWindowsByHand) {
  const BootstrapInterval b = paired_bootstrap({{0.0, 1.0}});
  EXPECT_EQ(b.lo, 0.0);
  EXPECT_EQ(b.hi, 1.0);
  EXPECT_EQ(b.mean, 0.5);
  EXPECT_FALSE(b.resolved);  // 0 is in [0, 1]: "not resolved"
  EXPECT_EQ(b.sign, 0);
}

// Seeds are paired window by window: +x on seed 1 and −x on seed 2 cancel in every window.
TEST(ReportBootstrap, SeedsArePairedByWindow) {
  const std::vector<double> a = {0.3, -0.1, 0.2, 0.5}, m = {-0.3, 0.1, -0.2, -0.5};
  const BootstrapInterval b = paired_bootstrap({a, m});
  EXPECT_EQ(b.lo, 0.0);
  EXPECT_EQ(b.hi, 0.0);
  EXPECT_FALSE(b.resolved);
  EXPECT_EQ(b.seeds, 2);
}

// Many windows of i.i.d. N(μ, σ²) differences: the bootstrap interval approaches the normal
// one, μ̂ ± 1.96·s/√W (here σ = 1, W = 400: half-width 0.098); the draws are reproducible
// and change with the bootstrap seed.
TEST(ReportBootstrap, LargeSampleWidthMatchesNormalTheoryAndIsReproducible) {
  const int W = 400;
  std::vector<double> d(W);
  double mean = 0, sq = 0;
  for (int i = 0; i < W; ++i) {
    // Box–Muller on splitmix64 uniforms (independent of the bootstrap's own draws).
    const double u1 = (double(splitmix64(7, 2 * i) >> 11) + 0.5) / 9007199254740992.0;
    const double u2 = (double(splitmix64(7, 2 * i + 1) >> 11) + 0.5) / 9007199254740992.0;
    d[i] = 0.05 + std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    mean += d[i];
  }
  mean /= W;
  for (double x : d) sq += (x - mean) * (x - mean);
  const double s = std::sqrt(sq / (W - 1)), half = 1.959964 * s / std::sqrt(double(W));
  const BootstrapInterval b = paired_bootstrap({d});
  EXPECT_NEAR(b.mean, mean, 1e-12);
  EXPECT_NEAR((b.hi - b.lo) / 2, half, 0.08 * half);  // Monte Carlo error of 10^4 resamples
  EXPECT_NEAR((b.hi + b.lo) / 2, mean, 0.1 * half);
  const BootstrapInterval again = paired_bootstrap({d});
  EXPECT_EQ(again.lo, b.lo);
  EXPECT_EQ(again.hi, b.hi);
  const BootstrapInterval other = paired_bootstrap({d}, 10000, 1);
  EXPECT_NE(other.lo, b.lo);
  EXPECT_NEAR(other.lo, b.lo, 0.1 * half);
}

TEST(ReportBootstrap, RejectsRaggedAndEmptyInput) {
  EXPECT_THROW(paired_bootstrap({}), std::invalid_argument);
  EXPECT_THROW(paired_bootstrap({{}}), std::invalid_argument);
  EXPECT_THROW(paired_bootstrap({{1.0, 2.0}, {1.0}}), std::invalid_argument);
  EXPECT_THROW(paired_bootstrap({{1.0}}, 0), std::invalid_argument);
}

namespace {
// Runs of `recipe` for seeds 1..n with the given final-window losses and, optionally,
// per-window held-out NLL (policy none).
std::vector<RunRecord> seeded(const std::string& recipe, const std::vector<double>& loss,
                              const std::vector<std::vector<double>>& windows = {}) {
  std::vector<RunRecord> out;
  for (size_t i = 0; i < loss.size(); ++i) {
    RunRecord r = run(recipe, loss[i], 10, 1);
    r.seed = i + 1;
    if (i < windows.size()) {
      r.heldout_windows["none"] = windows[i];
      double s = 0;
      for (double v : windows[i]) s += v;
      r.heldout["none"] = s / windows[i].size();
    }
    out.push_back(r);
  }
  return out;
}
std::vector<RunRecord> cat(std::vector<RunRecord> a, const std::vector<RunRecord>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
Hypothesis beats(const std::string& a, const std::string& b, const std::string& metric = "final_loss") {
  Hypothesis h;
  h.id = "H";
  h.claim = a + " beats " + b;
  h.metric = metric;
  h.contrast = {{a, 1.0}, {b, -1.0}};
  h.expect = -1;
  return h;
}
}  // namespace

// Verdicts on contrasts, with the t-interval of PairedIntervalsAndTheirVerdicts' hand
// calculation: A − B = {−0.10, −0.12, −0.11} → [−0.1348, −0.0852].
TEST(ReportHypotheses, VerdictsFollowTheIntervalAndTheExpectedSign) {
  const auto runs = cat(seeded("A", {4.90, 5.88, 5.39}), seeded("B", {5.00, 6.00, 5.50}));
  Verdict v = judge_hypothesis(beats("A", "B"), runs);
  EXPECT_EQ(v.verdict, "supported");
  ASSERT_EQ(v.per_seed.size(), 3u);
  EXPECT_NEAR(v.per_seed[1], -0.12, 1e-12);
  EXPECT_NEAR(v.t95.lo, -0.11 - 0.024842, 1e-6);
  EXPECT_EQ(judge_hypothesis(beats("B", "A"), runs).verdict, "contradicted");
  // Differences {−0.1, +0.3, −0.1}: the interval contains 0.
  const auto wide = cat(seeded("A", {4.9, 6.3, 5.4}), seeded("B", {5.0, 6.0, 5.5}));
  v = judge_hypothesis(beats("A", "B"), wide);
  EXPECT_EQ(v.verdict, "not resolved");
  EXPECT_NE(v.why.find("contains 0"), std::string::npos) << v.why;
  EXPECT_EQ(judge_hypothesis(beats("A", "C"), runs).verdict, "not run");
  EXPECT_EQ(judge_hypothesis(beats("A", "B"), cat(seeded("A", {4.9}), seeded("B", {5.0}))).verdict,
            "not resolved");
  // A three-recipe contrast: A − 0.5 B − 0.5 C with C = B − 0.2 on every seed:
  // per seed (A − B) + 0.1 = {0.0, −0.02, −0.01} → not resolved (contains 0).
  Hypothesis h;
  h.id = "H2";
  h.contrast = {{"A", 1.0}, {"B", -0.5}, {"C", -0.5}};
  const auto three = cat(runs, seeded("C", {4.80, 5.80, 5.30}));
  v = judge_hypothesis(h, three);
  EXPECT_NEAR(v.contrast.mean, -0.01, 1e-12);
  EXPECT_EQ(v.verdict, "not resolved");
}

TEST(ReportHypotheses, HeldOutNllNeedsTheBootstrapToAgree) {
  // Seeds agree (A − B = −0.1 ± small) but on seed 1 the windows disagree wildly.
  const std::vector<std::vector<double>> wa = {{5.0, 5.0, 5.0, 5.0}, {5.9, 5.9, 5.9, 5.9}, {5.4, 5.4, 5.4, 5.4}};
  const std::vector<std::vector<double>> wb = {{5.1, 5.1, 5.1, 5.1}, {6.0, 6.0, 6.0, 6.0}, {5.5, 5.5, 5.5, 5.5}};
  auto runs = cat(seeded("A", {1, 1, 1}, wa), seeded("B", {1, 1, 1}, wb));
  // Seed 3 a little different so the seed std is not 0: A − B = −0.1, −0.1, −0.12.
  for (auto& r : runs)
    if (r.recipe == "A" && r.seed == 3) {
      for (auto& x : r.heldout_windows["none"]) x = 5.38;
      r.heldout["none"] = 5.38;
    }
  Verdict v = judge_hypothesis(beats("A", "B", "heldout_nll"), runs);
  EXPECT_EQ(v.verdict, "supported") << v.why;
  EXPECT_TRUE(v.boot.resolved);
  EXPECT_EQ(v.boot.windows, 4);
  // Windows of seed 1 now ±3 around the same mean: the bootstrap over windows contains 0.
  for (auto& r : runs)
    if (r.recipe == "A" && r.seed == 1) r.heldout_windows["none"] = {2.0, 8.0, 2.0, 8.0};
  v = judge_hypothesis(beats("A", "B", "heldout_nll"), runs);
  EXPECT_EQ(v.verdict, "not resolved");
  EXPECT_NE(v.why.find("bootstrap"), std::string::npos) << v.why;
  // Without per-window values: not resolved, and it says why.
  for (auto& r : runs) r.heldout_windows.clear();
  v = judge_hypothesis(beats("A", "B", "heldout_nll"), runs);
  EXPECT_EQ(v.verdict, "not resolved");
  EXPECT_NE(v.why.find("per-window"), std::string::npos) << v.why;
}

// The same contrast on every seed (counts): the t-interval has zero width, which says nothing
// about the spread, so nothing is resolved.
TEST(ReportHypotheses, AZeroWidthIntervalResolvesNothing) {
  Hypothesis h;
  h.id = "H4";
  h.metric = "grad_norm_excursions";
  h.contrast = {{"A", 1.0}, {"B", -1.0}};
  h.expect = 1;
  auto a = seeded("A", {5, 5, 5}), b = seeded("B", {5, 5, 5});
  for (auto& r : a) r.grad_norm[4] = 2.0;  // one excursion in every run of A
  const Verdict v = judge_hypothesis(h, cat(a, b));
  EXPECT_EQ(v.per_seed, (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(v.verdict, "not resolved");
  EXPECT_NE(v.why.find("same value on every seed"), std::string::npos) << v.why;
  h.expect = 0;
  h.margin = 5;
  EXPECT_EQ(judge_hypothesis(h, cat(a, b)).verdict, "not resolved");
}

TEST(ReportHypotheses, ClaimsAreEscapedInTheTable) {
  Hypothesis h = beats("A", "B");
  h.claim = "a | b\nc";
  const std::string md = hypotheses_md({h}, cat(seeded("A", {4.9, 5.9}), seeded("B", {5.0, 6.0})));
  EXPECT_NE(md.find("| a \\| b c |"), std::string::npos) << md;
}

TEST(ReportHypotheses, EquivalenceWithAMargin) {
  Hypothesis h;
  h.id = "H8";
  h.contrast = {{"A", 1.0}, {"B", -1.0}};
  h.expect = 0;
  h.margin = 0.05;
  // A − B = {0.001, −0.002, 0.0}: mean −0.000333, interval well inside ±0.05.
  auto runs = cat(seeded("A", {5.001, 5.998, 5.5}), seeded("B", {5.0, 6.0, 5.5}));
  EXPECT_EQ(judge_hypothesis(h, runs).verdict, "supported");
  h.margin = 0.001;  // now the interval reaches past ±0.001
  EXPECT_EQ(judge_hypothesis(h, runs).verdict, "not resolved");
  h.margin = 0.05;  // A − B = {0.2, 0.21, 0.19}: wholly outside ±0.05
  runs = cat(seeded("A", {5.2, 6.21, 5.69}), seeded("B", {5.0, 6.0, 5.5}));
  EXPECT_EQ(judge_hypothesis(h, runs).verdict, "contradicted");
}

TEST(ReportHypotheses, GradNormExcursionsCountDivergedRunsToo) {
  Hypothesis h;
  h.id = "H4";
  h.metric = "grad_norm_excursions";
  h.contrast = {{"A", 1.0}, {"B", -1.0}};
  h.expect = 1;
  auto a = seeded("A", {5, 5, 5}), b = seeded("B", {5, 5, 5});
  // run(): grad norm 0.5 after warmup except step 7 (gn_late = 1 → not an excursion).
  for (int s = 0; s < 3; ++s) a[s].grad_norm[4] = a[s].grad_norm[5] = 2.0;  // steps 5, 6
  a[0].grad_norm[8] = 3.0;  // and step 9 on seed 1
  a[2].diverged_at = 9;     // a diverged run still counts
  const Verdict v = judge_hypothesis(h, cat(a, b));
  ASSERT_EQ(v.per_seed.size(), 3u);
  EXPECT_EQ(v.per_seed[0], 3);
  EXPECT_EQ(v.per_seed[1], 2);
  EXPECT_EQ(v.per_seed[2], 2);
  // {3, 2, 2}: mean 7/3, std √(1/3), half-width 4.3027·√(1/3)/√3 = 1.4342 → lo 0.899.
  EXPECT_EQ(v.verdict, "supported");
  EXPECT_NEAR(v.t95.lo, 7.0 / 3 - 4.3027 * std::sqrt(1.0 / 3) / std::sqrt(3.0), 1e-4);
  // B with more: contradicted.
  h.expect = -1;
  EXPECT_EQ(judge_hypothesis(h, cat(a, b)).verdict, "contradicted");
}

namespace {
fs::path write_study(const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("fp4_study_" + std::to_string(getpid()) + ".toml");
  std::ofstream(p) << text;
  return p;
}
std::string load_error(const std::string& text) {
  const fs::path p = write_study(text);
  try {
    load_hypotheses(p);
  } catch (const UserError& e) {
    fs::remove(p);
    return e.what();
  }
  fs::remove(p);
  return "";
}
}  // namespace

TEST(ReportHypotheses, StudyFilesParseAndBadOnesAreNamed) {
  const fs::path p = write_study(
      "[[hypothesis]]\nid = \"H5\"\nclaim = \"b16 beats b32\"\nlower = \"ue5m3-b16\"\nthan = \"ue5m3-b32\"\n"
      "[[hypothesis]]\nid = \"H2\"\nclaim = \"gap\"\nmetric = \"heldout_nll\"\npolicy = \"current\"\n"
      "contrast = { \"ue5m3-te\" = 1.0, \"nvfp4-te\" = -0.5, \"bf16\" = -0.5 }\nexpect = \"negative\"\n"
      "[[hypothesis]]\nid = \"H8\"\nclaim = \"same\"\ncontrast = { a = 1, b = -1 }\nexpect = \"equivalent\"\nmargin = 0.01\n");
  const auto hs = load_hypotheses(p);
  fs::remove(p);
  ASSERT_EQ(hs.size(), 3u);
  EXPECT_EQ(hs[0].contrast, (std::vector<std::pair<std::string, double>>{{"ue5m3-b16", 1}, {"ue5m3-b32", -1}}));
  EXPECT_EQ(hs[0].expect, -1);
  EXPECT_EQ(hs[1].metric, "heldout_nll");
  EXPECT_EQ(hs[1].policy, "current");
  // In the file's order, not toml++'s sorted one.
  EXPECT_EQ(hs[1].contrast, (std::vector<std::pair<std::string, double>>{
                                {"ue5m3-te", 1}, {"nvfp4-te", -0.5}, {"bf16", -0.5}}));
  EXPECT_EQ(hs[2].expect, 0);
  EXPECT_EQ(hs[2].margin, 0.01);
  const std::string head = "[[hypothesis]]\nid = \"X\"\nclaim = \"c\"\n";
  EXPECT_NE(load_error(head + "lower = \"a\"\nthan = \"b\"\ncolour = 1\n").find("unknown key 'colour'"), std::string::npos);
  EXPECT_NE(load_error("[[hypothesis]]\nclaim = \"c\"\n").find("missing string 'id'"), std::string::npos);
  EXPECT_NE(load_error(head + "metric = \"loss\"\nlower = \"a\"\nthan = \"b\"\n").find("metric 'loss'"), std::string::npos);
  EXPECT_NE(load_error(head + "lower = \"a\"\nthan = \"b\"\ncontrast = { a = 1 }\n").find("either"), std::string::npos);
  EXPECT_NE(load_error(head + "contrast = { a = 0 }\nexpect = \"negative\"\n").find("every coefficient"), std::string::npos);
  EXPECT_NE(load_error(head + "contrast = { a = 1, b = -1 }\nexpect = \"down\"\n").find("expect must be"), std::string::npos);
  EXPECT_NE(load_error(head + "contrast = { a = 1, b = -1 }\nexpect = \"equivalent\"\n").find("needs margin"), std::string::npos);
  // A contrast compares recipes: its coefficients sum to 0.
  EXPECT_NE(load_error(head + "contrast = { a = 1, b = 0 }\nexpect = \"negative\"\n").find("sum to 1, not 0"), std::string::npos);
  EXPECT_NE(load_error("[[hypothesis]]\nid = \"\"\nclaim = \"c\"\nlower = \"a\"\nthan = \"b\"\n").find("'id' is empty"), std::string::npos);
  EXPECT_NE(load_error("[[hypothesis]]\nid = \"X\"\nclaim = \"\"\nlower = \"a\"\nthan = \"b\"\n").find("'claim' is empty"), std::string::npos);
  EXPECT_NE(load_error(head + "metric = \"heldout_nll\"\npolicy = \"nonee\"\nlower = \"a\"\nthan = \"b\"\n").find("unknown policy 'nonee'"), std::string::npos);
  EXPECT_NE(load_error(head + "policy = \"current\"\nlower = \"a\"\nthan = \"b\"\n").find("'policy' goes with metric"), std::string::npos);
  EXPECT_NE(load_error(head + "lower = \"a\"\nthan = \"b\"\nmargin = 1\n").find("'margin' goes with"), std::string::npos);
  EXPECT_NE(load_error(head + "lower = \"a\"\nthan = \"a\"\n").find("same recipe"), std::string::npos);
  EXPECT_NE(load_error(head + "lower = \"a\"\nthan = \"b\"\n" + head + "lower = \"a\"\nthan = \"b\"\n").find("used twice"), std::string::npos);
  EXPECT_NE(load_error("x = 1\n").find("no [[hypothesis]]"), std::string::npos);
  EXPECT_NE(load_error("[[hypothesis]\n").find("malformed TOML"), std::string::npos);
}

// The shipped study names only shipped recipes, so every hypothesis can be run.
TEST(ReportHypotheses, TheShippedStudyNamesShippedRecipes) {
  const fs::path root = FP4_SOURCE_DIR;
  const auto hs = load_hypotheses(root / "configs/studies/claims.toml");
  EXPECT_GE(hs.size(), 8u);
  for (const auto& h : hs)
    for (const auto& [name, coef] : h.contrast)
      EXPECT_TRUE(fs::exists(root / "configs/recipes" / (name + ".toml"))) << h.id << ": " << name;
}

// task.json (`fp4train eval --task next-sentence --json`): read back, checked, pooled over
// seeds with the same items, and tabulated (docs/evaluation.md "Downstream task: `eval --task
// next-sentence`"). Values by hand.
TEST(ReportTask, TaskJsonIsReadCheckedAndPooledOverSeeds) {
  const fs::path d = fs::temp_directory_path() / ("fp4_report_task_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d / "summary.json") << R"({"status":"completed","recipe":"bf16","seed":1,"steps":2,
    "final_window_loss":5.5,"tokens_per_s":10,"heldout_nll":5.6,"heldout_nll_quant":5.6})";
  std::ofstream(d / "metrics.jsonl") << "{\"step\":1,\"loss\":6,\"grad_norm\":1}\n";
  auto task = [&](const std::string& results) {
    std::ofstream(d / "task.json") << R"({"task":"next-sentence","items":4,"chance":0.25,
      "items_fnv1a64":"abc","results":{)" << results << "}}";
  };
  auto expect_error = [&](const std::string& needle) { expect_read_run_error(d, needle); };
  task(R"("none":{"accuracy":0.5,"accuracy_per_char":0.25,"correct":"1100","correct_per_char":"1000"},
          "current":{"accuracy":null,"accuracy_per_char":null})");
  RunRecord a = read_run(d);
  EXPECT_EQ(a.task, "next-sentence");
  EXPECT_EQ(a.task_items_hash, "abc");
  EXPECT_DOUBLE_EQ(a.task_chance, 0.25);
  EXPECT_EQ(a.task_results.at("none").correct, "1100");
  EXPECT_TRUE(a.task_results.at("current").correct.empty());  // non-finite scores
  // An accuracy that disagrees with its outcomes, or outcomes of the wrong length.
  task(R"("none":{"accuracy":0.75,"accuracy_per_char":0.25,"correct":"1100","correct_per_char":"1000"})");
  expect_error("disagrees");
  task(R"("none":{"accuracy":0.5,"accuracy_per_char":0.25,"correct":"110","correct_per_char":"1000"})");
  expect_error("not 4 characters");
  std::ofstream(d / "task.json") << R"({"results":{}})";
  expect_error("missing 'task'");
  std::ofstream(d / "task.json") << R"({"task":"next-sentence","items":4,"chance":0.25,"results":{}})";
  expect_error("items_fnv1a64");
  task(R"("none":{"accuracy":0.5,"accuracy_per_char":0.25,"correct_per_char":"1000"})");
  expect_error("missing string 'correct'");
  fs::remove_all(d);

  // Two seeds on the same items pool their outcomes: 2/4 and 4/4 correct → 6/8 = 75%; a run
  // on other items is left out of the pool.
  RunRecord b = a;
  b.seed = 2;
  b.task_results["none"] = {"1111", "0110"};
  RunRecord c = a;
  c.seed = 3;
  c.task_items_hash = "other";
  c.task_results["none"] = {"0000", "0000"};
  const auto rows = aggregate_runs({a, b, c}, {"bf16"});
  ASSERT_EQ(rows.size(), 1u);
  const TaskRow& t = rows[0].task_rows.at("none");
  EXPECT_EQ(t.seeds, 2);
  EXPECT_EQ(t.items, 4);
  EXPECT_DOUBLE_EQ(t.raw.mean, 0.75);
  EXPECT_DOUBLE_EQ(t.per_char.mean, 0.375);  // (1 + 2) / 8
  // Per item, over the two seeds: 1, 1, 0.5, 0.5. A resample of the 4 items draws only
  // items 3 and 4 (mean 0.5) with probability 1/16 = 6.25% > 2.5%, only items 1 and 2
  // (mean 1) likewise: the percentile interval is exactly [0.5, 1].
  EXPECT_DOUBLE_EQ(t.raw.lo, 0.5);
  EXPECT_DOUBLE_EQ(t.raw.hi, 1.0);
  EXPECT_EQ(rows[0].task_rows.count("current"), 0u);  // no finite scores: no row
  EXPECT_EQ(rows[0].task_excluded, 1);                 // c: other items
  ReportContext ctx;
  ctx.policies = {"none", "current"};
  const std::string md = comparison_report_md(rows, {a, b, c}, ctx);
  EXPECT_NE(md.find("## Downstream task: next-sentence"), std::string::npos) << md;
  EXPECT_NE(md.find("chance is 25%"), std::string::npos) << md;
  // The whole row: none pooled over 2 seeds, current without a value.
  EXPECT_NE(md.find("| bf16 | 2 | 75.0% [50.0, 100.0] | 37.5% ["), std::string::npos) << md;
  EXPECT_NE(md.find("] | — | — |\n"), std::string::npos) << md;
  EXPECT_NE(md.find("1 run(s) hold a task.json of other items"), std::string::npos) << md;
  // Most runs decide the items: with two runs on "other", a's and b's items are left out.
  RunRecord c2 = c;
  c2.seed = 4;
  const auto rows2 = aggregate_runs({a, c, c2}, {"bf16"});
  EXPECT_EQ(rows2[0].task_items_hash, "other");
  EXPECT_EQ(rows2[0].task_excluded, 1);
  EXPECT_DOUBLE_EQ(rows2[0].task_rows.at("none").raw.mean, 0.0);
  // Without any task.json there is no task section.
  EXPECT_EQ(comparison_report_md(aggregate_runs({run("bf16", 4.0, 20, 1)}, {"bf16"}),
                                 {run("bf16", 4.0, 20, 1)}, ReportContext{})
                .find("Downstream task"),
            std::string::npos);
}

// task-minimal-pairs.json (`fp4train eval --task minimal-pairs --json`): read back and
// checked (docs/evaluation.md "Minimal pairs: `eval --task minimal-pairs`").
TEST(ReportMinimalPairs, TaskFileIsReadAndChecked) {
  const fs::path d = fs::temp_directory_path() / ("fp4_report_pairs_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d / "summary.json") << R"({"status":"completed","recipe":"bf16","seed":1,"steps":2,
    "final_window_loss":5.5,"tokens_per_s":10,"heldout_nll":5.6,"heldout_nll_quant":5.6,
    "compute":{"cpu":"Test CPU"}})";
  std::ofstream(d / "metrics.jsonl") << "{\"step\":1,\"loss\":6,\"grad_norm\":1}\n";
  auto file = [&](const std::string& paradigms, const std::string& results) {
    std::ofstream(d / "task-minimal-pairs.json")
        << R"({"task":"minimal-pairs","items":4,"items_fnv1a64":"abc","step":2,"paradigms":)"
        << paradigms << R"(,"results":{)" << results << "}}";
  };
  // The six paradigms, covering the 4 items: swap 0..1, cloze 2..3, the others empty.
  auto six = [](const std::string& swap_first) {
    return R"([{"name":"swap","first":)" + swap_first + R"(,"items":2,"chance":0.5},
               {"name":"shuffle","first":2,"items":0,"chance":0.5},
               {"name":"det-noun","first":2,"items":0,"chance":0.5},
               {"name":"a-an","first":2,"items":0,"chance":0.5},
               {"name":"subj-verb","first":2,"items":0,"chance":0.5},
               {"name":"cloze","first":2,"items":2,"chance":0.25}])";
  };
  const std::string two = six("0");
  file(two, R"("none":{"finite":true,"credit":"102-","margin":[1.5,-0.25,0,null]},
               "current":{"finite":false})");
  const RunRecord a = read_run(d);
  EXPECT_EQ(a.cpu, "Test CPU");
  EXPECT_EQ(a.pairs.items_hash, "abc");
  ASSERT_EQ(a.pairs.paradigms.size(), 6u);
  EXPECT_EQ(a.pairs.paradigms[5].name, "cloze");
  EXPECT_EQ(a.pairs.paradigms[5].first, 2u);
  EXPECT_DOUBLE_EQ(a.pairs.paradigms[5].chance, 0.25);
  const auto& o = a.pairs.results.at("none");
  EXPECT_EQ(o.credit[0], 1.0);
  EXPECT_EQ(o.credit[2], 0.5);
  EXPECT_TRUE(std::isnan(o.credit[3]) && std::isnan(o.margin[3]));
  EXPECT_DOUBLE_EQ(o.margin[1], -0.25);
  EXPECT_EQ(a.pairs.results.count("current"), 0u);  // non-finite: no outcomes
  auto expect_error = [&](const std::string& needle) { expect_read_run_error(d, needle); };
  file(two, R"("none":{"finite":true,"credit":"1","margin":[1]})");
  expect_error("must hold 4 items");
  file(two, R"("none":{"finite":true,"credit":"1000","margin":[-1,0,0,0]})");
  expect_error("item 0's credit disagrees with its margin");
  file(two, R"("none":{"finite":true,"credit":"1x00","margin":[1,0,0,0]})");
  expect_error("is not 0, 1, 2..9 or -");
  file(six("1"), "");
  expect_error("first is 1, expected 0");
  file(six("-1"), "");
  expect_error("paradigm swap: first must be a non-negative integer");
  file(R"([{"name":"cloze","first":0,"items":4,"chance":0.25}])", "");
  expect_error("paradigm 1 is 'cloze', expected the paradigms in the order of the task");
  file(R"([{"name":"swap","first":0,"items":2,"chance":0.5}])", "");
  expect_error("must be the task's 6 and cover its 4 items");
  file(two, R"("none":{"finite":"yes"})");
  expect_error("results.none: missing boolean 'finite'");
  file(two, R"("none":{"finite":true,"credit":"1020","margin":[1,-1,"x",0]})");
  expect_error("margin holds a non-number");
  std::ofstream(d / "task-minimal-pairs.json") << R"({"task":"minimal-pairs","items":"4","items_fnv1a64":"abc","paradigms":[],"results":{}})";
  expect_error("items must be a non-negative integer");
  std::ofstream(d / "task-minimal-pairs.json") << R"({"task":"next-sentence","results":{}})";
  expect_error("not a minimal-pairs task file");
  fs::remove_all(d);
}

// The report's section: accuracy pooled over seeds per paradigm, and the item-paired
// comparison with its discordant counts and McNemar p. Values by hand.
TEST(ReportMinimalPairs, SectionPoolsSeedsAndPairsItems) {
  auto rec = [](const std::string& recipe, uint64_t seed, std::vector<double> credit,
                std::vector<double> margin) {
    RunRecord r = run(recipe, 4.0, 20, 1);
    r.seed = seed;
    r.cpu = "AMD EPYC";
    r.pairs.items_hash = "abc";
    r.pairs.paradigms = {{"swap", 0, 2, 0.5}, {"cloze", 2, 2, 0.25}};
    r.pairs.results["none"] = {credit, margin};
    return r;
  };
  const std::vector<RunRecord> runs = {
      rec("bf16", 1, {1, 1, 0, 1}, {1, 2, -1, 0.5}), rec("bf16", 2, {1, 1, 1, 1}, {1, 1, 1, 1}),
      rec("fp4", 1, {1, 0, 0, 1}, {0.5, -1, -2, 0.5}), rec("fp4", 2, {1, 1, 0, 0}, {1, 1, -0.5, -1})};
  const std::string md = minimal_pairs_md(runs, {"bf16", "fp4"}, {"none"}, "bf16", {});
  EXPECT_NE(md.find("## Minimal pairs"), std::string::npos) << md;
  EXPECT_NE(md.find("swap (2 items, 50%), cloze (2 items, 25%)."), std::string::npos) << md;
  // bf16: swap items (1, 1) → 100%; cloze items: seed means 0.5 and 1 → 75%; a resample of
  // the two cloze items is (0.5, 0.5) with probability 1/4, so the interval is [50, 100].
  EXPECT_NE(md.find("| bf16 | none | 2 | 100.0% [100.0, 100.0] | 75.0% [50.0, 100.0] |"),
            std::string::npos) << md;
  // fp4 − bf16: credit differences per item (mean over seeds) 0, −0.5, −0.5, −0.5 → −37.5
  // points; discordant pairs: 0 right under fp4 only, 3 under bf16 only → p = 2 · (1/2)^3.
  EXPECT_NE(md.find("| `fp4` − `bf16` | none | 2 | -37.5 ["), std::string::npos) << md;
  EXPECT_NE(md.find("| 0 / 3 | 0.25 |"), std::string::npos) << md;
  // Margin differences per item (mean over seeds): swap (−0.5 + 0)/2, (−3 + 0)/2 → −0.25,
  // −1.5: mean −0.875; cloze (−1 − 1.5)/2, (0 − 2)/2 → −1.25, −1: mean −1.125; every resample
  // of either pair is below 0, so both are marked.
  EXPECT_NE(md.find("| 0 / 3 | 0.25 | -0.875* | -1.125* |"), std::string::npos) << md;
  // The margin table: bf16 swap items (1 + 1)/2 and (2 + 1)/2 → +1.25, resamples 1 .. 1.5.
  EXPECT_NE(md.find("| bf16 | none | 2 | +1.250 [+1.000, +1.500] |"), std::string::npos) << md;
  // A seed whose runs were made on different CPUs is not paired.
  std::vector<RunRecord> mixed = runs;
  mixed[3].cpu = "Intel Xeon";  // fp4, seed 2
  const std::string mm = minimal_pairs_md(mixed, {"bf16", "fp4"}, {"none"}, "bf16", {});
  EXPECT_NE(mm.find("| `fp4` − `bf16` | none | 1 (1 left out: other CPU) | "), std::string::npos) << mm;
  // A cloze interval reaching chance is named: fp4's cloze items have seed means 0 and 0.5.
  EXPECT_NE(md.find("fp4 / none / cloze"), std::string::npos) << md;
  // No run with minimal-pairs results: no section.
  EXPECT_EQ(minimal_pairs_md({run("bf16", 4.0, 20, 1)}, {"bf16"}, {"none"}, "bf16", {}), "");
}

// The power table's seed count (docs/recipes.md "Studies: claims as hypotheses", **Power**),
// by hand from the t table: sd 0.01 needs n = 18
// (t₁₆ · 0.01 / √17 = 0.00514 > 0.005; t₁₇ · 0.01 / √18 = 0.00497); sd 0.006 needs 9
// (t₇ · 0.006 / √8 = 0.00502; t₈ · 0.006 / 3 = 0.00461).
TEST(ReportPower, SeedsForAHalfWidth) {
  EXPECT_EQ(seeds_for_half_width(0.01, 0.005), 18);
  EXPECT_EQ(seeds_for_half_width(0.006, 0.005), 9);
  EXPECT_EQ(seeds_for_half_width(0.0, 0.005), 2);
  EXPECT_EQ(seeds_for_half_width(std::nan(""), 0.005), 0);
  EXPECT_EQ(seeds_for_half_width(0.01, 0.0), 0);
  // The section shows it for a contrast with 3 seeds: A − B = {−0.10, −0.12, −0.11}, std 0.01.
  const auto runs = cat(seeded("A", {4.90, 5.88, 5.39}), seeded("B", {5.00, 6.00, 5.50}));
  const std::string md = hypotheses_md({beats("A", "B")}, runs);
  EXPECT_NE(md.find("| H | final_loss | 3 | 0.0100 | ±0.0248 | 18 |"), std::string::npos) << md;
}

// Pairs never cross CPU families: a seed whose runs were made on different CPUs is left out
// of a contrast and of the paired Δ vs the baseline, and the verdict says so.
TEST(ReportHypotheses, SeedsOnDifferentCpusAreNotPaired) {
  auto runs = cat(seeded("A", {4.90, 5.88, 5.39, 9.0}), seeded("B", {5.00, 6.00, 5.50, 5.0}));
  for (auto& r : runs) r.cpu = (r.recipe == "A" && r.seed == 4) ? "Intel Xeon" : "AMD EPYC";
  const Verdict v = judge_hypothesis(beats("A", "B"), runs);
  EXPECT_EQ(v.per_seed.size(), 3u);  // seed 4 (A on Intel, B on AMD) is left out
  EXPECT_EQ(v.verdict, "supported");
  EXPECT_NE(v.why.find("1 seed(s) left out: their runs were made on different CPUs"), std::string::npos) << v.why;
  const auto rows = aggregate_runs(runs, {"B", "A"}, "B");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].paired_delta_baseline.n, 3);
  EXPECT_NEAR(rows[1].paired_delta_baseline.mean, -0.11, 1e-12);
}

// heldout_nll_last: the mean of the last kLastEvals val_nll values of metrics.jsonl.
TEST(ReportHypotheses, HeldoutNllLastAveragesTheLastEvaluations) {
  ASSERT_EQ(kLastEvals, 2);
  const fs::path d = fs::temp_directory_path() / ("fp4_report_last_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d / "summary.json") << R"({"status":"completed","recipe":"bf16","seed":1,"steps":3,
    "final_window_loss":5.5,"tokens_per_s":10,"heldout_nll":5.6,"heldout_nll_quant":5.6})";
  std::ofstream(d / "metrics.jsonl") << "{\"step\":1,\"loss\":6,\"grad_norm\":1,\"val_nll\":7.0}\n"
                                        "{\"step\":2,\"loss\":6,\"grad_norm\":1,\"val_nll\":6.5}\n"
                                        "{\"step\":3,\"loss\":6,\"grad_norm\":1,\"val_nll\":6.0}\n";
  RunRecord r = read_run(d);
  EXPECT_EQ(r.val_step, (std::vector<int>{1, 2, 3}));
  EXPECT_DOUBLE_EQ(r.heldout_last, 6.25);
  std::ofstream(d / "metrics.jsonl") << "{\"step\":1,\"loss\":6,\"grad_norm\":1,\"val_nll\":7.0}\n";
  EXPECT_TRUE(std::isnan(read_run(d).heldout_last));  // fewer than 2 evaluations
  fs::remove_all(d);
  RunRecord a = run("A", 5.0, 20, 1), b = run("B", 5.0, 20, 1);
  a.heldout_last = 4.0, b.heldout_last = 4.5;
  RunRecord a2 = a, b2 = b;
  a2.seed = b2.seed = 2;
  a2.heldout_last = 4.1;
  Hypothesis h = beats("A", "B", "heldout_nll_last");
  const Verdict v = judge_hypothesis(h, {a, b, a2, b2});
  ASSERT_EQ(v.per_seed.size(), 2u);
  EXPECT_DOUBLE_EQ(v.per_seed[0], -0.5);
  EXPECT_NEAR(v.per_seed[1], -0.4, 1e-12);
}
