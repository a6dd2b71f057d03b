// What `ps`, `status`, `logs`, the dashboard and /metrics read of a run, in-process: run
// directories written here (status.json, metrics.jsonl, logs) and read by the monitor's
// functions. tests/dashboard_test.cc serves the same views to Chromium and a real Prometheus.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "job/paths.h"
#include "job/run_status.h"
#include "monitor/prometheus.h"
#include "monitor/view.h"

namespace trainctl::monitor {
namespace {

namespace fs = std::filesystem;

class MonitorTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trainctl-monitor-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text, bool append = false) {
    fs::create_directories(fs::path(dir_ + "/" + name).parent_path());
    std::ofstream(dir_ + "/" + name, append ? std::ios::app : std::ios::trunc) << text;
  }
  // A run of this machine whose launcher is `pid` (0: none, it is gone).
  runs::RunEntry Entry(const std::string& run_id, int64_t pid) const {
    runs::RunEntry e;
    e.name = "mon";
    e.run_id = run_id;
    e.output_dir = dir_;
    e.nodes = 2;
    e.procs_per_node = 2;
    e.tasks = 4;
    e.pid = pid;
    e.start_ticks = pid ? runs::StartTicks(pid) : 0;
    return e;
  }
  void Status(const std::string& run_id, RunState state) {
    RunStatus s;
    s.job = "mon";
    s.run_id = run_id;
    s.state = state;
    if (state != RunState::kRunning) s.exit_code = state == RunState::kSucceeded ? 0 : 3;
    ASSERT_TRUE(WriteRunStatus(dir_, s).ok());
  }
  std::string dir_;
};

TEST_F(MonitorTest, ARunningRunWhoseLauncherIsGoneIsLost) {
  Status("mon-1", RunState::kRunning);
  EXPECT_EQ(View(Entry("mon-1", ::getpid())).state, RunState::kRunning);  // this process: alive
  const RunView gone = View(Entry("mon-1", 0));
  EXPECT_FALSE(gone.alive);
  EXPECT_EQ(gone.state, RunState::kLost);
  Status("mon-1", RunState::kFailed);
  EXPECT_EQ(View(Entry("mon-1", 0)).state, RunState::kFailed);  // it said how it ended
}

TEST_F(MonitorTest, ARunMovedAsideByALaterOneIsReadFromPrevious) {
  Status("mon-2", RunState::kRunning);  // the later run's status.json, in the output directory
  fs::create_directories(dir_ + "/previous/mon-1");
  RunStatus old;
  old.job = "mon";
  old.run_id = "mon-1";
  old.state = RunState::kSucceeded;
  old.exit_code = 0;
  ASSERT_TRUE(WriteRunStatus(dir_ + "/previous/mon-1", old).ok());
  const RunView v = View(Entry("mon-1", 0));
  EXPECT_EQ(v.dir, dir_ + "/previous/mon-1");
  EXPECT_EQ(v.state, RunState::kSucceeded);
}

TEST_F(MonitorTest, ProgressIsTheLastEpochStepLossAndAccuracyLogged) {
  EXPECT_EQ(Progress(dir_), "-");
  Write("metrics.jsonl",
        "{\"epoch\": 1, \"step\": 100, \"loss\": 0.5}\n{\"epoch\": 1, \"step\": 200, \"loss\": 0.25}\n");
  EXPECT_EQ(Progress(dir_), "epoch 1 step 200 loss 0.2500");
  Write("metrics.jsonl", "{\"epoch\": 1, \"step\": 200, \"test_accuracy\": 0.91}\nnot json\n", true);
  EXPECT_EQ(Progress(dir_), "epoch 1 step 200 loss 0.2500 acc 0.9100");
}

TEST_F(MonitorTest, LogFilesAreInRankOrderRolesByTheSpecsOrder) {
  for (const char* name : {"worker-10.log", "worker-2.log", "worker-0.log", "ps-0.log", "ps-1.log", "notes.txt"}) {
    Write("logs/" + std::string(name), "x\n");
  }
  fs::create_symlink("/etc/hostname", dir_ + "/logs/worker-3.log");  // not what trainctl wrote
  const std::string logs = dir_ + "/logs/";
  EXPECT_EQ(LogFiles(logs, "worker", -1, nullptr),
            (std::vector<std::string>{logs + "worker-0.log", logs + "worker-2.log", logs + "worker-10.log"}));
  const nlohmann::json spec = {{"roles", {{{"name", "ps"}, {"replicas", 2}}, {{"name", "worker"}, {"replicas", 11}}}}};
  EXPECT_EQ(LogFiles(logs, "", -1, spec),
            (std::vector<std::string>{logs + "ps-0.log", logs + "ps-1.log", logs + "worker-0.log",
                                      logs + "worker-2.log", logs + "worker-10.log"}));
  EXPECT_EQ(LogFiles(logs, "", 4, spec), (std::vector<std::string>{logs + "worker-2.log"}));  // rank 2 + 2 ps
}

TEST_F(MonitorTest, AFollowerReadsWholeLinesAndStartsOverWhenTheFileIsReplaced) {
  const std::string path = dir_ + "/metrics.jsonl";
  JsonLinesFollower f;
  std::vector<int> seen;
  int starts = 0;
  auto read = [&] {
    f.Read(
        path, [&] { ++starts, seen.clear(); }, [&](const nlohmann::json& j) { seen.push_back(j["step"]); });
  };
  Write("metrics.jsonl", "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3");  // the third still being written
  read();
  EXPECT_EQ(seen, (std::vector<int>{1, 2}));
  Write("metrics.jsonl", "}\n{\"step\": 4}\n", true);
  read();
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(starts, 1);
  Write("metrics.jsonl", "{\"step\": 9}\n");  // a later run's, shorter
  read();
  EXPECT_EQ(seen, (std::vector<int>{9}));
  EXPECT_EQ(starts, 2);
}

TEST_F(MonitorTest, PrometheusTextCarriesEachRunsSeriesAndEscapesItsLabels) {
  EXPECT_EQ(EscapeLabel("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  Status("mon-1", RunState::kSucceeded);
  Write("metrics.jsonl",
        "{\"step\": 10, \"loss\": 0.5, \"window_seconds\": 2, \"window_steps\": 10, "
        "\"samples_per_s\": 640, \"data_seconds\": 0.1, \"comm_seconds\": 0.3}\n");
  MetricsExporter exporter;
  const runs::RunEntry e = Entry("mon-1", 0);
  std::string text = exporter.Render({e});
  const std::string labels = "{job=\"mon\",run_id=\"mon-1\"}";
  EXPECT_NE(text.find("# TYPE trainctl_train_steps_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("trainctl_train_steps_total" + labels + " 10"), std::string::npos) << text;
  EXPECT_NE(text.find("trainctl_train_samples_total" + labels + " 1280"), std::string::npos) << text;
  EXPECT_NE(text.find("trainctl_job_failed" + labels + " 0"), std::string::npos) << text;
  // The next scrape reads only what was appended since.
  Write("metrics.jsonl",
        "{\"step\": 20, \"loss\": 0.25, \"window_seconds\": 1, \"window_steps\": 10, "
        "\"samples_per_s\": 1280}\n{\"test_accuracy\": 0.9}\n",
        true);
  text = exporter.Render({e});
  EXPECT_NE(text.find("trainctl_train_steps_total" + labels + " 20"), std::string::npos) << text;
  EXPECT_NE(text.find("trainctl_train_samples_total" + labels + " 2560"), std::string::npos) << text;
  EXPECT_NE(text.find("trainctl_train_step_duration_seconds_count" + labels + " 20"), std::string::npos) << text;
  EXPECT_NE(text.find("trainctl_test_accuracy" + labels + " 0.9"), std::string::npos) << text;
}

}  // namespace
}  // namespace trainctl::monitor
