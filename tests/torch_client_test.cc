// The environment contract with a real client: Debian's python3-torch initialises a gloo
// process group from env:// under trainctl and runs an allreduce whose result it checks.
#include <ctime>
#include <nlohmann/json.hpp>
#include <tuple>

#include "test_util.h"

namespace trainctl::testing {
namespace {

// A job running tests/python/SCRIPT with Debian's Python; `layout` is the spec's other fields.
std::string PythonJob(const Scratch& s, const std::string& name, const std::string& layout, const std::string& script) {
  return s.Write("job.yaml", "name: " + name + "\n" + layout + "command: [" + TRAINCTL_TEST_PYTHON + ", " +
                                 TRAINCTL_SOURCE_DIR + "/tests/python/" + script + "]\noutput_dir: " + s.path("out") +
                                 "\n");
}

TEST(TorchClient, UnmodifiedDdpScriptAllreducesAcrossNodesAndWorkers) {
  SpawnOptions probe;
  probe.argv = {TRAINCTL_TEST_PYTHON, "-c", "import torch.distributed"};
  probe.env = CurrentEnvironment();
  auto has_torch = RunCommand(probe, std::chrono::seconds(60));
  if (!has_torch.ok() || has_torch->exit.code != 0) {
    GTEST_FAIL() << TRAINCTL_TEST_PYTHON << " with torch is required (apt-get install python3-torch)";
  }
  Scratch s;
  PythonJob(s, "ddp", "nodes: 2\nprocs_per_node: 2\n", "allreduce.py");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""), std::chrono::seconds(120));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    auto result = nlohmann::json::parse(s.Read("out/result-" + std::to_string(rank) + ".json"));
    EXPECT_EQ(result["rank"], rank);
    EXPECT_EQ(result["world"], 4);
    EXPECT_EQ(result["sum"], (std::vector<double>{10.0, 4.0}));  // 1+2+3+4, and 4 ones
    EXPECT_EQ(result["local_rank"], rank % 2);
    EXPECT_EQ(result["group_rank"], rank / 2);
  }
}

// torch's @record writes each rank's exception to its TORCHELASTIC_ERROR_FILE. The report shows
// the exception and traceback, and names as root cause the rank that failed first (rank 1, by
// the files' timestamps) although rank 0 exited first and rank 1 was stopped by trainctl.
TEST(TorchClient, RecordErrorFilesNameTheRootCauseBeforeTheFirstExit) {
  Scratch s;
  PythonJob(s, "record", "procs_per_node: 2\nrestart: {max_restarts: 0}\n", "record_failure.py");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""), std::chrono::seconds(120));
  EXPECT_EQ(r.exit.code, 3) << r.output;
  const size_t root = r.output.find("root cause (first observed failure, by the tasks' error files): worker 1 (rank 1");
  const size_t then = r.output.find("then: worker 0 (rank 0");
  ASSERT_NE(root, std::string::npos) << r.output;
  ASSERT_NE(then, std::string::npos) << r.output;
  EXPECT_LT(root, then);
  EXPECT_NE(r.output.find("error: ValueError: rank 1 failed first"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("error: RuntimeError: rank 0 failed second"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("raise ValueError(\"rank 1 failed first\")"), std::string::npos) << "its traceback\n"
                                                                                           << r.output;
  auto status = nlohmann::json::parse(s.Read("out/status.json"));
  EXPECT_EQ(status["root_cause"]["rank"], 1);
  EXPECT_EQ(status["failure"]["rank"], 0);
  EXPECT_LT(status["root_cause"]["error_time"].get<int64_t>(), status["failure"]["error_time"].get<int64_t>());
  // One error file per rank and attempt, as torch wrote it.
  auto file = nlohmann::json::parse(s.Read("out/logs/errors/worker-1.r0.t0.json"));
  EXPECT_EQ(file["message"]["message"], "ValueError: rank 1 failed first");
}

// torch 1.13 writes whole-second timestamps: two ranks failing within one second tie. The file's
// finer time names the one that failed first (rank 1, which exits later), not the lower rank.
TEST(TorchClient, ErrorFilesOfTheSameSecondNameTheFirstFailure) {
  Scratch s;
  // One second for both ranks, far enough ahead for both to have imported torch on a busy machine.
  const std::string second = std::to_string(::time(nullptr) + 12);
  s.Write("job.yaml", "name: tie\nprocs_per_node: 2\nrestart: {max_restarts: 0}\nenv: {SAME_SECOND: \"" + second +
                          "\"}\n"
                          "command: [" +
                          std::string(TRAINCTL_TEST_PYTHON) + ", " + TRAINCTL_SOURCE_DIR +
                          "/tests/python/record_failure.py]\noutput_dir: " + s.path("out") + "\n");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""), std::chrono::seconds(120));
  EXPECT_EQ(r.exit.code, 3) << r.output;
  auto status = nlohmann::json::parse(s.Read("out/status.json"));
  ASSERT_EQ(status["root_cause"]["error_time"], status["failure"]["error_time"]) << "not one second:\n" << r.output;
  EXPECT_EQ(status["root_cause"]["rank"], 1) << r.output;
  EXPECT_NE(r.output.find("root cause (first observed failure, by the tasks' error files): worker 1 (rank 1"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("error: ValueError: rank 1 failed"), std::string::npos) << r.output;
}

// torch's file timers, served as torchrun's agent serves them (TORCHELASTIC_ENABLE_FILE_TIMER=1):
// a rank whose expires() block outlives its timer is ended within seconds and named as the
// failure, with the timer's scope (finding 8 of issue 49).
TEST(TorchClient, AnExpiredFileTimerEndsItsRankAndNamesIt) {
  Scratch s;
  s.Write("job.yaml",
          "name: timer\nprocs_per_node: 2\nrestart: {max_restarts: 0}\n"
          "env: {TORCHELASTIC_ENABLE_FILE_TIMER: \"1\"}\ncommand: [" +
              std::string(TRAINCTL_TEST_PYTHON) + ", " + TRAINCTL_SOURCE_DIR +
              "/tests/python/file_timer.py]\noutput_dir: " + s.path("out") + "\n");
  const auto start = Clock::now();
  auto r = Trainctl({"run", "job.yaml"}, s.path(""), std::chrono::seconds(120));
  EXPECT_EQ(r.exit.code, 3) << r.output;
  EXPECT_LT(SecondsSince(start), 60) << r.output;
  EXPECT_NE(r.output.find("rank 1 has a timer file"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("worker 1 (rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("past its file timer \"the hanging call\""), std::string::npos) << r.output;
}

// Error files that are not torch's JSON, or too large, are ignored with a warning naming them;
// the report falls back to the output's last lines; nothing crashes or waits.
TEST(TorchClient, BadErrorFilesAreNamedAndIgnored) {
  Scratch s;
  for (const auto& [name, write, warning] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"garbage", "printf '{not json' > \"$TORCHELASTIC_ERROR_FILE\"", "not a JSON object"},
           {"huge", "head -c 2000000 /dev/zero | tr '\\0' x > \"$TORCHELASTIC_ERROR_FILE\"", "is larger than"},
           {"stamp",
            "printf '{\"message\": {\"message\": \"E\", \"extraInfo\": {\"timestamp\": \"soon\"}}}' > "
            "\"$TORCHELASTIC_ERROR_FILE\"",
            "timestamp \"soon\" is not a number of seconds"}}) {
    s.Write(name + ".sh", write + "\necho the last words\nexit 5\n");
    s.Write(name + ".yaml", "name: " + name + "\nrestart: {max_restarts: 0}\noutput_dir: " + s.path(name) +
                                "\ncommand: [sh, " + s.path(name + ".sh") + "]\n");
    auto r = Trainctl({"run", name + ".yaml"}, s.path(""), std::chrono::seconds(60));
    EXPECT_EQ(r.exit.code, 3) << r.output;
    EXPECT_NE(
        r.output.find("ignoring the error file of worker 0: " + s.path(name) + "/logs/errors/worker-0.r0.t0.json"),
        std::string::npos)
        << r.output;
    EXPECT_EQ(CountLines(r.output, "ignoring the error file of worker 0"), 1) << r.output;  // read once
    EXPECT_NE(r.output.find(warning), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("| the last words"), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace trainctl::testing
