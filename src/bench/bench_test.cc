// The matrix's expansion, its located errors, and the MLPerf-style aggregation.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <tuple>

#include "bench/matrix.h"
#include "bench/results.h"
#include "common/fs.h"

namespace trainctl::bench {
namespace {

Matrix Parse(const std::string& text) {
  auto m = ParseMatrix(text, "m.yaml");
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? *m : Matrix{};
}

TEST(BenchMatrix, TheCrossProductWithoutExcludedPointsThenTheIncludedOnes) {
  Matrix m = Parse(
      "name: b\nspec: {name: j, command: ['true']}\n"
      "axes: {procs_per_node: [1, 2], trainer.batch_size: [32, 64], trainer.optimizer.name: [sgd, 'adam']}\n"
      "exclude: [{procs_per_node: 1, trainer.batch_size: 64}]\n"
      "include: [{procs_per_node: 4, trainer.batch_size: 32, trainer.optimizer.name: sgd}]\n"
      "repeats: 2\npeers: [{name: ddp, command: [torchrun, --nproc_per_node, '{procs_per_node}', x.py]}]\n");
  const auto points = Points(m);
  ASSERT_EQ(points.size(), 2u * 2 * 2 - 2 + 1);
  EXPECT_EQ(points[0],
            (Point{{"procs_per_node", "1"}, {"trainer.batch_size", "32"}, {"trainer.optimizer.name", "sgd"}}));
  EXPECT_EQ(points[1][2].second, "\"adam\"") << "a quoted string stays a string when --set parses it";
  EXPECT_EQ(points.back()[0], (std::pair<std::string, std::string>{"procs_per_node", "4"}));
  const auto exps = Experiments(m);
  ASSERT_EQ(exps.size(), points.size() * 2 * 2);  // x (trainctl + ddp) x repeats
  EXPECT_EQ(exps[0].id, "trainctl-procs_per_node_1-trainer.batch_size_32-trainer.optimizer.name_sgd-r1");
  EXPECT_EQ(exps[1].system, "ddp");
  EXPECT_EQ(exps[1].command, (std::vector<std::string>{"torchrun", "--nproc_per_node", "1", "x.py"}));
  EXPECT_EQ(exps.back().repeat, 1);
  EXPECT_EQ(exps[1].workers, 0) << "no workers: given: the point's world size";
  Matrix counted = Parse(
      "name: b\nspec: {name: j, command: ['true']}\naxes: {procs_per_node: [2, 4]}\n"
      "peers: [{name: one, command: [a], workers: 1}, {name: ddp, command: [b], workers: '{procs_per_node}'}]\n");
  const auto with = Experiments(counted);
  ASSERT_EQ(with.size(), 6u);
  EXPECT_EQ(with[1].workers, 1);
  EXPECT_EQ(with[2].workers, 2);
  EXPECT_EQ(with[5].workers, 4);
  EXPECT_NE(ParseMatrix("name: b\nspec: {name: j}\npeers: [{name: p, command: [a], workers: many}]\n", "m.yaml")
                .status()
                .message()
                .find("m.yaml:3: peers[0].workers: expected the peer's number of worker processes"),
            std::string::npos);
}

// MLPerf's runs differ in their seed: repeat r trains with trainer.seed + r, and a peer's {repeat}
// is r.
TEST(BenchMatrix, EachRepeatHasASeedOfItsOwn) {
  char dir[] = "/tmp/bench-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string spec = std::string(dir) + "/job.yaml";
  ASSERT_TRUE(AtomicWriteFile(spec, "name: j\ntrainer: {model: cnn, seed: 40}\n").ok());
  auto parsed =
      ParseMatrix("name: b\nspec: job.yaml\nrepeats: 3\npeers: [{name: p, command: [p.py, --seed, '{repeat}']}]\n",
                  std::string(dir) + "/m.yaml");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  const Matrix& m = *parsed;
  const auto exps = Experiments(m);
  ASSERT_EQ(exps.size(), 6u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(exps[2 * r + 1].command, (std::vector<std::string>{"p.py", "--seed", std::to_string(r)}));
    auto resolved = ExperimentSpec(m, spec, exps[2 * r].point, std::string(dir) + "/out", exps[2 * r].repeat);
    ASSERT_TRUE(resolved.ok()) << resolved.status().message();
    EXPECT_EQ(resolved->trainer.seed, 40 + r);
  }
  RemoveAll(dir);
}

TEST(BenchMatrix, ErrorsNameTheLineAndTheField) {
  auto m = ParseMatrix(
      "name: b\nspec: {name: j}\naxes:\n  procs_per_node: 3\nrepeats: zero\nparalel: 2\n"
      "peers: [{name: trainctl, command: [x]}]\n",
      "m.yaml");
  ASSERT_FALSE(m.ok());
  const std::string e = m.status().message();
  EXPECT_NE(e.find("m.yaml:4: axes.procs_per_node: expected a non-empty list of values"), std::string::npos) << e;
  EXPECT_NE(e.find("m.yaml:5: repeats: expected a whole number from 1 to 1000, got \"zero\""), std::string::npos) << e;
  EXPECT_NE(e.find("m.yaml:6: paralel: unknown field"), std::string::npos) << e;
  EXPECT_NE(e.find("m.yaml:7: peers[0].name: expected a name of its own"), std::string::npos) << e;
  EXPECT_NE(
      ParseMatrix("name: b\nspec: nosuch.yaml\n", "d/m.yaml").status().message().find("no such file: d/nosuch.yaml"),
      std::string::npos);
  // Shapes the fuzzer found (bench_fuzz): an error, not an exception.
  EXPECT_NE(ParseMatrix("name: b\nspec: {name: j}\npeers: [x]\n", "m.yaml")
                .status()
                .message()
                .find("m.yaml:3: peers[0]: expected {name, command}"),
            std::string::npos);
  EXPECT_FALSE(ParseMatrix("name: b\nspec: {name: j}\naxes: {[a]: [1]}\n", "m.yaml").ok());
  // A peer's placeholder that names no axis would reach it as literal text: refused, with the nearest.
  auto holes = ParseMatrix(
      "name: b\nspec: {name: j}\naxes: {trainer.batch_size: [32]}\npeers:\n"
      "  - {name: p, command: [x, '--bs={trainer.batchsize}', '{repeat}', '{nope}', '{}']}\n",
      "m.yaml");
  ASSERT_FALSE(holes.ok());
  const std::string h = holes.status().message();
  EXPECT_NE(h.find("m.yaml:5: peers[0].command[1]: {trainer.batchsize} names no axis of the matrix; did you mean "
                   "{trainer.batch_size}?"),
            std::string::npos)
      << h;
  EXPECT_NE(h.find("peers[0].command[3]: {nope} names no axis"), std::string::npos) << h;
  EXPECT_EQ(h.find("command[2]"), std::string::npos) << h;
  EXPECT_EQ(h.find("command[4]"), std::string::npos) << h;
}

Figures Made(const std::string& system, int workers, double epoch, double rate,
             const std::string& state = "succeeded") {
  Figures f;
  f.system = system;
  f.point = {{"procs_per_node", std::to_string(workers)}};
  f.workers = workers;
  f.state = state;
  f.epoch_seconds = epoch;
  f.samples_per_s = rate;
  return f;
}

TEST(BenchResults, FiveOrMoreRunsDropTheFastestAndTheSlowestAndScalingIsPerWorker) {
  std::vector<Figures> runs;
  for (double e : {10.0, 1.0, 2.0, 3.0, 4.0}) {
    runs.push_back(Made("trainctl", 1, e, 100));
    runs.back().wall_seconds = 2 * e + 1;
  }
  for (double r : {150.0, 170.0}) runs.push_back(Made("trainctl", 2, 1, r));
  runs.push_back(Made("trainctl", 2, 99, 1, "failed"));  // not counted
  const auto a = Aggregates(runs);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_TRUE(a[0].mlperf);
  EXPECT_DOUBLE_EQ(a[0].epoch_mean, 3.0);  // 2, 3, 4
  EXPECT_DOUBLE_EQ(a[0].epoch_std, 1.0);
  EXPECT_DOUBLE_EQ(a[0].wall_mean, 7.0);  // 5, 7, 9: a job without epochs (a no-op) has its wall time
  EXPECT_DOUBLE_EQ(a[0].wall_std, 2.0);
  EXPECT_LT(a[1].wall_mean, 0) << "no wall time recorded";
  EXPECT_FALSE(a[1].mlperf);
  EXPECT_EQ(a[1].runs, 3);
  EXPECT_EQ(a[1].succeeded, 2);
  EXPECT_DOUBLE_EQ(a[1].rate_mean, 160);
  EXPECT_DOUBLE_EQ(a[1].efficiency, 0.8);  // 80 per worker against 100
  EXPECT_DOUBLE_EQ(a[0].efficiency, 1.0);
}

// MLPerf's rule for the time to accuracy: a run that missed the target (or failed) is the slowest;
// with five runs it is dropped as such, with two it leaves no figure.
TEST(BenchResults, ARunThatMissesTheTargetCountsAsTheSlowest) {
  auto run = [](double tta, const std::string& state = "succeeded") {
    Figures f = Made("trainctl", 1, 10, 100, state);
    f.time_to_accuracy = tta;
    return f;
  };
  std::vector<Figures> one_miss = {run(5), run(6), run(7), run(-1), run(8)};
  auto a = Aggregates(one_miss, 0.91);
  EXPECT_DOUBLE_EQ(a[0].tta_mean, 7.0);  // 6, 7, 8: the 5 and the miss dropped
  EXPECT_EQ(a[0].missed, 1);
  std::vector<Figures> two_misses = {run(5), run(-1), run(6), run(7, "failed"), run(7)};
  a = Aggregates(two_misses, 0.91);
  EXPECT_LT(a[0].tta_mean, 0) << "a miss is among the runs that count";
  EXPECT_EQ(a[0].missed, 2);
  EXPECT_DOUBLE_EQ(a[0].epoch_mean, 10.0);  // the other figures: the runs that succeeded
  EXPECT_LT(Aggregates(one_miss)[0].tta_mean, 0) << "no target, no time to it";
}

TEST(BenchResults, CompareFlagsThroughputDownAndEpochTimeUpPastTheThreshold) {
  std::vector<Figures> a = {Made("trainctl", 1, 10, 100), Made("trainctl", 2, 6, 180)};
  std::vector<Figures> b = {Made("trainctl", 1, 10.2, 98), Made("trainctl", 2, 8, 140)};
  int regressions = -1;
  const std::string table = Compare(a, b, 0.05, &regressions);
  EXPECT_EQ(regressions, 1) << table;
  EXPECT_NE(table.find("procs_per_node=2"), std::string::npos);
  // A long point is shown whole, never cut.
  std::vector<Figures> wide = {Made("trainctl", 1, 10, 100)};
  wide[0].point.emplace_back("trainer.optimizer.weight_decay_of_a_long_name", "0.000128");
  EXPECT_NE(Compare(wide, wide, 0.05, &regressions).find("weight_decay_of_a_long_name=0.000128 "), std::string::npos);
  EXPECT_NE(table.find("REGRESSION"), std::string::npos);
  Compare(a, a, 0.05, &regressions);
  EXPECT_EQ(regressions, 0);
}

// A result set written by bench reads back as it was; one edited by hand or written by another
// tool, with a field of the wrong type, is an error naming the experiment and the field, not a
// crash (json::value threw; found by bench_fuzz) or a float turned into an int.
// An experiment's status.json is the run's, in its output directory: a failure record with fields
// of other types still gives a report, from what is there (this threw type_error).
TEST(BenchResults, AFailureWithFieldsOfOtherTypesIsReportedFromWhatIsThere) {
  char dir[] = "/tmp/bench-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  ASSERT_TRUE(AtomicWriteFile(std::string(dir) + "/status.json",
                              R"({"restarts": 2, "failure": {"kind": 3, "role": "worker", "rank": "one",)"
                              R"( "exit": "exit code 1", "error": ["x"]}})")
                  .ok());
  Figures f;
  ReadFigures(dir, 0, &f);
  EXPECT_EQ(f.failure, "task failure: worker rank -1, exit code 1");
  EXPECT_EQ(f.restarts, 2);
  std::filesystem::remove_all(dir);
}

TEST(BenchResults, AResultSetReadsBackAndAMistypedFieldIsNamed) {
  char dir[] = "/tmp/bench-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  Figures f = Made("trainctl", 2, 6, 180);
  f.loss = {{1, 2.5}, {2, 2.25}};
  nlohmann::json doc = {{"experiments", {f.ToJson()}}};
  ASSERT_TRUE(AtomicWriteFile(std::string(dir) + "/results.json", doc.dump()).ok());
  auto back = ReadResults(dir);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].ToJson(), f.ToJson());
  for (const auto& [field, value, want] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"state", 3, "\"state\" is number, expected text"},
           {"samples_per_s", "fast", "\"samples_per_s\" is string, expected a number"},
           {"repeat", 1e30, "\"repeat\" is 1e+30, expected a whole number"},
           {"workers", 2.5, "\"workers\" is 2.5, expected a whole number"}}) {
    nlohmann::json bad = doc;
    bad["experiments"].push_back(f.ToJson());
    bad["experiments"][1][field] = value;
    ASSERT_TRUE(AtomicWriteFile(std::string(dir) + "/results.json", bad.dump()).ok());
    auto r = ReadResults(dir);
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_EQ(r.status().message(), std::string(dir) + "/results.json: experiments[1]: " + want);
  }
  RemoveAll(dir);
}

}  // namespace
}  // namespace trainctl::bench
