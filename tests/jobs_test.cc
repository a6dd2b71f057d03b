// Jobs on this machine, watched from another terminal: explicit runs (a rerun starts fresh, one
// live run per output directory), `trainctl ps`, `status`, `logs [-f]` and `stop`, with real
// processes. Each test has its own run index (TRAINCTL_STATE_DIR).
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

using std::chrono::seconds;
using Env = std::vector<std::pair<std::string, std::string>>;

Env StateIn(const Scratch& s) { return {{"TRAINCTL_STATE_DIR", s.path("state")}}; }

// The processes of a run (its agents name it on their command line).
std::vector<pid_t> RunProcesses(const std::string& run_id) {
  return LiveProcesses([&](pid_t pid) {
    auto argv = ProcStrings(pid, "cmdline");
    return std::find(argv.begin(), argv.end(), run_id) != argv.end();
  });
}

// A rerun moves the previous run's files aside and trains from scratch; --resume continues from
// the newest checkpoint and says which.
TEST(Jobs, ARerunStartsFreshAndResumeSaysWhereItContinues) {
  Scratch s;
  s.Write("job.yaml", "name: fresh\nprocs_per_node: 2\noutput_dir: " + s.path("out") +
                          "\ntrainer:\n  model: cnn\n  data: {limit: 256, test_limit: 64}\n  batch_size: 16\n"
                          "  max_steps: 4\n  threads: 1\n  checkpoint_every: 2\n  eval: false\n");
  auto first = Trainctl({"run", "job.yaml"}, s.path(""), seconds(120), StateIn(s));
  ASSERT_EQ(first.exit.code, 0) << first.output;
  const std::string first_id = nlohmann::json::parse(s.Read("out/status.json"))["run_id"];
  auto second = Trainctl({"run", "job.yaml"}, s.path(""), seconds(120), StateIn(s));
  ASSERT_EQ(second.exit.code, 0) << second.output;
  EXPECT_NE(second.output.find(s.path("out") + " held an earlier run, moved to " + s.path("out/previous/" + first_id) +
                               ": this run starts from scratch"),
            std::string::npos)
      << second.output;
  EXPECT_EQ(second.output.find("resuming from"), std::string::npos) << second.output;
  EXPECT_TRUE(Exists(s.path("out/previous/" + first_id + "/checkpoints")));
  EXPECT_TRUE(Exists(s.path("out/previous/" + first_id + "/logs/worker-0.log")));
  EXPECT_EQ(CountLines(s.Read("out/metrics.jsonl"), "{\"step\": 4, "), 1) << "the rerun trained its 4 steps";
  auto resumed =
      Trainctl({"run", "job.yaml", "--resume", "--set", "trainer.max_steps=6"}, s.path(""), seconds(120), StateIn(s));
  ASSERT_EQ(resumed.exit.code, 0) << resumed.output;
  EXPECT_TRUE(std::regex_search(
      resumed.output, std::regex("resuming from " + s.path("out/checkpoints") + "/ckpt-0*4\\.safetensors \\(step 4,")))
      << resumed.output;
  EXPECT_EQ(nlohmann::json::parse(s.Read("out/job.json"))["trainer"]["resume"], true);
}

// Starts `trainctl run` of job `name`, which only sleeps, in the background, and waits until its
// status.json says running: its run id, or "" when it never did.
std::string RunSleeper(const Scratch& s, const std::string& name, std::optional<Background>* job) {
  WriteSpec(s, "name: " + name + "\ncommand: [sh, -c, 'sleep 30']\noutput_dir: {out}/out\n");
  job->emplace(std::vector<std::string>{"run", "job.yaml"}, s.path(""), s.path("run.log"), StateIn(s));
  if (!Eventually([&] { return s.Read("out/status.json").find("running") != std::string::npos; })) return "";
  return nlohmann::json::parse(s.Read("out/status.json"))["run_id"];
}

// A second run into the output directory of a live one is refused, naming it; the live run goes on.
TEST(Jobs, ASecondLiveRunOfTheSameOutputDirectoryIsRefused) {
  Scratch s;
  std::optional<Background> job;
  const std::string id = RunSleeper(s, "busy", &job);
  ASSERT_FALSE(id.empty()) << job->Output();
  auto again = Trainctl({"run", "job.yaml"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(again.exit.code, kExitInvalidSpec) << again.output;
  EXPECT_NE(again.output.find(s.path("out") + " is in use by the live run " + id + " (pid "), std::string::npos)
      << again.output;
  EXPECT_EQ(nlohmann::json::parse(s.Read("out/status.json"))["run_id"], id) << "the live run's files were touched";
  EXPECT_FALSE(Exists(s.path("out/previous")));
  auto stopped = Trainctl({"stop", "busy"}, s.path(""), seconds(60), StateIn(s));
  EXPECT_EQ(stopped.exit.code, 0) << stopped.output;
  EXPECT_EQ(job->Wait(seconds(30)).code, kExitInterrupted);
}

// From another terminal: ps lists the live run with its progress, logs -f attached mid-job sees
// every line once and ends with the job, stop ends it with nothing left, status says how.
TEST(Jobs, PsLogsFollowStatusAndStopFromAnotherTerminal) {
  Scratch s;
  WriteSpec(s,
            "name: watched\nnodes: 2\nprocs_per_node: 2\noutput_dir: {out}/out\n"
            "command: [sh, -c, 'i=0; while [ $i -lt 60 ]; do i=$((i+1)); echo \"line $i of rank $RANK\"; "
            "sleep 0.05; done; sleep 60']\n");
  Background job({"run", "job.yaml"}, s.path(""), s.path("run.log"), StateIn(s));
  ASSERT_TRUE(Eventually([&] { return s.Read("out/logs/worker-3.log").find("line 10 ") != std::string::npos; }))
      << job.Output();
  const std::string id = nlohmann::json::parse(s.Read("out/status.json"))["run_id"];
  Background follower({"logs", "watched", "-f"}, s.path(""), s.path("follow.log"), StateIn(s));

  auto ps = Trainctl({"ps"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(ps.exit.code, 0) << ps.output;
  EXPECT_TRUE(std::regex_search(ps.output, std::regex("watched +" + id + " +running +2x2 +- +\\d+"))) << ps.output;
  auto ps_json = nlohmann::json::parse(Trainctl({"ps", "--json"}, s.path(""), seconds(30), StateIn(s)).output);
  ASSERT_EQ(ps_json.size(), 1u);
  EXPECT_EQ(ps_json[0]["output_dir"], s.path("out"));

  // Every line written, then the job is stopped.
  // Every rank's: the nodes' agents start their workers at slightly different times.
  for (int rank = 0; rank < 4; ++rank) {
    const std::string log = "out/logs/worker-" + std::to_string(rank) + ".log";
    ASSERT_TRUE(Eventually([&] { return s.Read(log).find("line 60 ") != std::string::npos; })) << log;
  }
  auto stopped = Trainctl({"stop", "watched"}, s.path(""), seconds(60), StateIn(s));
  EXPECT_EQ(stopped.exit.code, 0) << stopped.output;
  EXPECT_NE(stopped.output.find("run " + id + " stopped (interrupted)"), std::string::npos) << stopped.output;
  EXPECT_EQ(job.Wait(seconds(30)).code, kExitInterrupted);
  EXPECT_EQ(follower.Wait(seconds(30)).code, 0) << "logs -f did not end with the job";
  EXPECT_TRUE(Eventually([&] { return RunProcesses(id).empty(); }, seconds(10))) << "processes outlived the stop";

  const std::string followed = s.Read("follow.log");
  for (int rank = 0; rank < 4; ++rank) {
    for (int i = 1; i <= 60; ++i) {
      const std::string line =
          "[worker-" + std::to_string(rank) + "] line " + std::to_string(i) + " of rank " + std::to_string(rank) + "\n";
      ASSERT_EQ(CountLines(followed, line.substr(0, line.size() - 1)), 1) << line << followed;
    }
  }
  // One rank, from the finished run's files.
  auto one = Trainctl({"logs", id, "--rank", "2"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(one.exit.code, 0) << one.output;
  EXPECT_EQ(CountLines(one.output, "[worker-2] line "), 60) << one.output;
  EXPECT_EQ(CountLines(one.output, "[worker-1]"), 0) << one.output;

  auto status = Trainctl({"status", "watched"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(status.exit.code, 0) << status.output;
  EXPECT_NE(status.output.find("job watched, run " + id + ": interrupted"), std::string::npos) << status.output;
  auto stop_again = Trainctl({"stop", "watched"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(stop_again.exit.code, kExitInvalidSpec);
  EXPECT_NE(stop_again.output.find("is not running (interrupted)"), std::string::npos) << stop_again.output;
  auto unknown = Trainctl({"logs", "nosuchjob"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(unknown.exit.code, kExitInvalidSpec);
  EXPECT_NE(unknown.output.find("no run of a job named or with run id 'nosuchjob' on this machine; jobs: watched"),
            std::string::npos)
      << unknown.output;
}

// top: each worker's CPU, memory and threads, where the trainer's steps go and which rank the
// others wait for; then refused for a run that has ended.
TEST(Jobs, TopShowsEachWorkerAndTheStepSplit) {
  Scratch s;
  s.Write("job.yaml", "name: busy-trainer\nprocs_per_node: 2\noutput_dir: " + s.path("out") +
                          "\ntrainer:\n  model: cnn\n  data: {limit: 2048, test_limit: 64}\n  batch_size: 32\n"
                          "  epochs: 200\n  threads: 1\n  log_every: 5\n  eval: false\n  balance: speed\n");
  Background job({"run", "job.yaml"}, s.path(""), s.path("run.log"), StateIn(s));
  ASSERT_TRUE(
      Eventually([&] { return s.Read("out/metrics.jsonl").find("window_seconds") != std::string::npos; }, seconds(60)))
      << job.Output();
  auto top = Trainctl({"top", "busy-trainer", "--once", "--interval", "1s"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(top.exit.code, 0) << top.output;
  EXPECT_TRUE(std::regex_search(top.output, std::regex("steps/s, \\d+ samples/s; a step: \\d+ % data, \\d+ % compute, "
                                                       "\\d+ % communication")))
      << top.output;
  // balance: speed: the smallest and the largest part of the global batch of 64.
  std::smatch parts;
  ASSERT_TRUE(std::regex_search(top.output, parts, std::regex("; batch split by speed: (\\d+) to (\\d+) a rank")))
      << top.output;
  EXPECT_EQ(std::stoi(parts[1]) + std::stoi(parts[2]), 64) << top.output;
  for (int rank = 0; rank < 2; ++rank) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(top.output, m,
                                  std::regex("\n" + std::to_string(rank) + " +worker-" + std::to_string(rank) +
                                             " +\\d+ +([0-9.]+) +([0-9.]+) +(\\d+)\n")))
        << top.output;
    EXPECT_GT(std::stod(m[1]), 20) << "a training worker uses CPU:\n" << top.output;
    EXPECT_GT(std::stod(m[2]), 50) << "LibTorch and the data take memory:\n" << top.output;
    EXPECT_GE(std::stoi(m[3]), 1);
  }
  EXPECT_EQ(top.output.find("GPU%"), std::string::npos) << "no NVML here, no GPU columns:\n" << top.output;
  // Where NVML is (a stand-in library here): the device, its utilization and the task's memory.
  std::smatch pid;
  ASSERT_TRUE(std::regex_search(top.output, pid, std::regex("\n1 +worker-1 +(\\d+)")));
  Env nvml = StateIn(s);
  nvml.emplace_back("LD_LIBRARY_PATH", NVML_STANDIN_DIR);
  nvml.emplace_back("NVML_STANDIN_PID", pid[1]);
  auto gpu = Trainctl({"top", "busy-trainer", "--once", "--interval", "100ms"}, s.path(""), seconds(30), nvml);
  EXPECT_NE(gpu.output.find("  GPU  GPU%  GPU MiB\n"), std::string::npos) << gpu.output;
  EXPECT_TRUE(
      std::regex_search(gpu.output, std::regex("\n1 +worker-1 +" + std::string(pid[1]) + " .*    0    87     1234\n")))
      << gpu.output;
  EXPECT_TRUE(std::regex_search(gpu.output, std::regex("\n0 +worker-0 .*    -     -        -\n"))) << gpu.output;
  // A straggler: worker 1 stopped for 1.5 s holds rank 0 in the gradient average, and the
  // window that holds the stop names rank 1 as the one the others waited for. (Unless the stop
  // lands while rank 1 itself waits, in the average or in the log window's own collective: then
  // both ranks' waits hold it, or neither does.)
  const pid_t worker1 = std::stoi(pid[1]);
  ASSERT_EQ(::kill(worker1, SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_EQ(::kill(worker1, SIGCONT), 0);
  const double resumed = WallSeconds();
  auto records = [&] {
    std::vector<nlohmann::json> out;
    std::istringstream lines(s.Read("out/metrics.jsonl"));
    for (std::string line; std::getline(lines, line);) out.push_back(nlohmann::json::parse(line, nullptr, false));
    return out;
  };
  ASSERT_TRUE(Eventually(
      [&] {
        auto all = records();
        return !all.empty() && all.back().is_object() && all.back().value("time", 0.0) > resumed + 1;
      },
      seconds(30)));
  int windows = 0;
  for (const auto& j : records()) {
    if (!j.is_object() || !j.contains("window_seconds")) continue;
    ++windows;
    ASSERT_TRUE(j.contains("slowest_rank")) << j.dump();
    const double least = j["comm_seconds_min"].get<double>(), most = j["comm_seconds_max"].get<double>();
    EXPECT_LE(least, most) << j.dump();
    EXPECT_NEAR(j["comm_seconds"].get<double>(), j["slowest_rank"].get<int>() == 0 ? least : most, 1e-6) << j.dump();
    if (most >= 1.0 && least < 1.0) EXPECT_EQ(j["slowest_rank"].get<int>(), 1) << j.dump();
  }
  EXPECT_GT(windows, 3);
  auto slow = Trainctl({"top", "busy-trainer", "--once", "--interval", "100ms"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_TRUE(std::regex_search(slow.output, std::regex("; slowest rank [01] \\(waiting \\d+ %, the others up to "
                                                        "\\d+ %\\)")))
      << slow.output;
  EXPECT_EQ(Trainctl({"stop", "busy-trainer"}, s.path(""), seconds(60), StateIn(s)).exit.code, 0);
  EXPECT_EQ(job.Wait(seconds(30)).code, kExitInterrupted);
  auto ended = Trainctl({"top", "busy-trainer", "--once"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(ended.exit.code, kExitInvalidSpec);
  EXPECT_NE(ended.output.find("is not running (interrupted)"), std::string::npos) << ended.output;
}

// logs --since: only what the tasks wrote in that last while (to the second).
TEST(Jobs, LogsSinceShowsOnlyTheRecentLines) {
  Scratch s;
  WriteSpec(s,
            "name: since\nprocs_per_node: 2\noutput_dir: {out}/out\n"
            "command: [sh, -c, 'echo \"early $RANK\"; sleep 3; echo \"late $RANK\"']\n");
  auto run = Trainctl({"run", "job.yaml"}, s.path(""), seconds(60), StateIn(s));
  ASSERT_EQ(run.exit.code, 0) << run.output;
  auto recent = Trainctl({"logs", "since", "--since", "2s"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(recent.exit.code, 0) << recent.output;
  EXPECT_EQ(CountLines(recent.output, "] late "), 2) << recent.output;
  EXPECT_EQ(CountLines(recent.output, "] early "), 0) << recent.output;
  auto all = Trainctl({"logs", "since", "--since", "1h"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(CountLines(all.output, "] early "), 2) << all.output;
  auto bad = Trainctl({"logs", "since", "--since", "lately"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(bad.exit.code, kExitInvalidSpec);
  EXPECT_NE(bad.output.find("--since: expected a duration such as 10m or 30s, got \"lately\""), std::string::npos)
      << bad.output;
}

// A launcher killed with SIGKILL cannot write how it ended: ps says the run was lost.
// A run the index says is on another host (a home directory shared between machines) is not
// stopped from here: its pid is that machine's, and signalling it here would hit whatever process
// has that number on this one.
TEST(Jobs, StopRefusesARunOfAnotherHost) {
  Scratch s;
  std::optional<Background> job;
  const std::string id = RunSleeper(s, "far", &job);
  ASSERT_FALSE(id.empty()) << job->Output();
  const std::string entry_file = "state/runs/" + id + ".json";
  auto entry = nlohmann::json::parse(s.Read(entry_file));
  entry["host"] = "another-host";
  s.Write(entry_file, entry.dump());
  auto stop = Trainctl({"stop", id}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(stop.exit.code, kExitInvalidSpec) << stop.output;
  EXPECT_NE(stop.output.find("run " + id + " of job far runs on another-host, not here"), std::string::npos)
      << stop.output;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a signalled launcher says so by then
  EXPECT_NE(s.Read("out/status.json").find("\"running\""), std::string::npos) << "the launcher here was signalled";
  ::kill(job->pid(), SIGTERM);
  EXPECT_EQ(job->Wait(seconds(30)).code, kExitInterrupted);
}

TEST(Jobs, ARunWhoseLauncherWasKilledIsShownAsLost) {
  Scratch s;
  std::optional<Background> job;
  const std::string id = RunSleeper(s, "killed", &job);
  ASSERT_FALSE(id.empty()) << job->Output();
  ::kill(job->pid(), SIGKILL);
  job->Wait(seconds(10));
  auto ps = Trainctl({"ps"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_TRUE(std::regex_search(ps.output, std::regex("killed +killed-[0-9a-f]+ +lost "))) << ps.output;
  auto status = Trainctl({"status", "killed"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(status.exit.code, kExitWorkerFailed) << status.output;
  // The next run of the job takes the directory over.
  WriteSpec(s, "name: killed\ncommand: ['true']\noutput_dir: {out}/out\n");
  auto next = Trainctl({"run", "job.yaml"}, s.path(""), seconds(30), StateIn(s));
  EXPECT_EQ(next.exit.code, 0) << next.output;
}

// A run's files are in the user's output directory, where anything may be: a status.json,
// metrics.jsonl or job.json with fields of other types (edited, another version's) shows as
// unknown, and every verb that reads them still answers. (ps, status and logs ended on an
// uncaught type_error: "terminate called ... type must be string, but is number".)
TEST(Jobs, FieldsOfAnotherTypeInARunsFilesShowAsUnknownNotACrash) {
  Scratch s;
  WriteSpec(s, "name: mangled\nprocs_per_node: 2\ncommand: [sh, -c, 'echo hello']\noutput_dir: {out}/out\n");
  auto run = Trainctl({"run", "job.yaml"}, s.path(""), seconds(30), StateIn(s));
  ASSERT_EQ(run.exit.code, 0) << run.output;
  const std::string id = ReadStatus(s)["run_id"];
  s.Write("out/status.json", "{\"run_id\": \"" + id +
                                 "\", \"state\": 5, \"elapsed\": [1], \"restarts\": \"x\", "
                                 "\"failure\": {\"role\": 1, \"rank\": \"a\", \"task_index\": 1e300, \"exit\": {}}}\n");
  s.Write("out/metrics.jsonl",
          "{\"epoch\": \"1\", \"step\": \"x\", \"loss\": null, \"window_seconds\": \"z\"}\n[1, 2]\n"
          "{\"step\": 5, \"window_seconds\": 1, \"window_steps\": \"many\", \"slowest_rank\": []}\n");
  s.Write("out/job.json", "{\"roles\": [1, {\"name\": 2, \"replicas\": \"x\"}], \"trainer\": 3}\n");
  for (const std::vector<std::string>& verb : std::vector<std::vector<std::string>>{
           {"ps"}, {"status", "mangled"}, {"logs", "mangled"}, {"top", "mangled", "--once"}}) {
    auto r = Trainctl(verb, s.path(""), seconds(30), StateIn(s));
    EXPECT_FALSE(r.exit.signaled) << verb[0] << ": " << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << verb[0] << ": " << r.output;
    if (verb[0] == "ps" || verb[0] == "status") {
      EXPECT_NE(r.output.find("unknown"), std::string::npos) << verb[0] << ": " << r.output;
    }
    if (verb[0] == "logs") EXPECT_NE(r.output.find("hello"), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace trainctl::testing
