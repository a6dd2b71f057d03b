// Jobs run on this machine, watched from any terminal: ps, status, logs and stop, from the run
// index (job/runs.h) and each run's output directory.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/verbs.h"
#include "common/address.h"
#include "common/cgroup.h"
#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/json_field.h"
#include "common/random.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "job/paths.h"
#include "job/records.h"
#include "job/runs.h"
#include "monitor/dashboard.h"
#include "monitor/gpu.h"
#include "monitor/view.h"

namespace trainctl::cli {

namespace {

namespace fs = std::filesystem;
using namespace monitor;
using nlohmann::json;

void Row(const std::vector<std::string>& cells, const std::vector<size_t>& widths) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) {
    line += cells[i];
    if (i + 1 < cells.size())
      line += std::string(widths[i] > cells[i].size() ? widths[i] - cells[i].size() + 2 : 2, ' ');
  }
  std::printf("%s\n", line.c_str());
}

// What a run whose launcher is gone (SIGKILLed) left in its cgroup: ended, and said so.
void EndOrphans(const runs::RunEntry& e) {
  if (e.cgroup.empty() || runs::Alive(e) || !CgroupPopulated(e.cgroup)) return;
  const int n = KillJobCgroup(e.cgroup);
  if (n > 0) {
    std::fprintf(stderr, "trainctl: run %s's launcher is gone; ended %d process(es) it left behind (its cgroup %s)\n",
                 e.run_id.c_str(), n, e.cgroup.c_str());
  }
}

int Ps(bool all, bool as_json) {
  if (Status st = runs::CheckIndex(); !st.ok()) return Fail("ps", st);
  auto entries = runs::List();
  for (const auto& e : entries) EndOrphans(e);
  std::vector<std::vector<std::string>> rows;
  json out = json::array();
  std::map<std::string, int> shown;  // without --all: the newest run of each job, and live ones
  for (const auto& e : entries) {
    RunView v = View(e);
    if (!all && !v.alive && shown[e.name]++ > 0) continue;
    const std::string progress = Progress(v.dir);
    out.push_back({{"name", e.name},
                   {"run_id", e.run_id},
                   {"state", RunStateName(v.state)},
                   {"tasks", Tasks(e)},
                   {"progress", progress},
                   {"elapsed", Elapsed(v)},
                   {"output_dir", v.dir},
                   {"pid", v.alive ? e.pid : 0},
                   {"target", e.target}});
    rows.push_back({e.name, e.run_id, RunStateName(v.state), Tasks(e), progress, Elapsed(v), v.dir});
  }
  if (as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return kExitOk;
  }
  const std::vector<std::string> header = {"NAME", "RUN ID", "STATE", "TASKS", "PROGRESS", "ELAPSED", "OUTPUT"};
  std::vector<size_t> widths(header.size());
  for (size_t i = 0; i < header.size(); ++i) widths[i] = header[i].size();
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) widths[i] = std::max(widths[i], r[i].size());
  }
  Row(header, widths);
  for (const auto& r : rows) Row(r, widths);
  return kExitOk;
}

// Where `log` holds what was written since `cutoff` (unix seconds), from its .times marks; 0 when
// there are none (all of it).
long SinceOffset(const std::string& log, int64_t cutoff) {
  auto marks = ReadFile(log + ".times", int64_t{64} << 20);
  if (!marks.ok()) return 0;
  for (const auto& line : SplitLines(*marks)) {
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    if (std::atoll(line.c_str() + space + 1) >= cutoff) return std::atol(line.c_str());
  }
  // Everything was written before the cutoff: start at the end.
  struct stat st {};
  return ::stat(log.c_str(), &st) == 0 ? static_cast<long>(st.st_size) : 0;
}

int Logs(const runs::RunEntry& e, bool follow, int rank, const std::string& role, int64_t since) {
  const RunView v = View(e);
  const std::string dir = paths::LogsDir(v.dir);
  if (!IsDirectory(dir)) return Fail("logs", NotFound("run " + e.run_id + " has no logs in " + dir));
  const json spec = ReadJson(paths::JobJson(v.dir));
  struct Tail {
    long offset = 0;
    std::string partial;
  };
  std::map<std::string, Tail> tails;
  if (rank >= 0 || !role.empty()) {
    // A rank or role the run does not have is a mistake, not an empty log.
    const auto all = LogFiles(dir, "", -1, spec);
    if (!all.empty() && LogFiles(dir, role, rank, spec).empty()) {
      std::vector<std::string> tasks;
      for (const auto& path : all) tasks.push_back(fs::path(path).stem().string());
      const std::string asked = (rank >= 0 ? "rank " + std::to_string(rank) : "") +
                                (!role.empty() ? (rank >= 0 ? " in role " : "role ") + role : "");
      return Fail("logs", InvalidArgument("run " + e.run_id + " has no task of " + asked + "; its " +
                                          std::to_string(all.size()) + " tasks, by rank: " + Join(tasks, ", ")));
    }
  }
  // Prints what each file gained since the last pass, whole lines only, each once, a chunk at a
  // time (a log of gigabytes is streamed, not held); a "line" longer than a chunk is cut there.
  constexpr int64_t kChunk = 1 << 20;
  auto pass = [&](bool last) {
    for (const auto& path : LogFiles(dir, role, rank, spec)) {
      auto [it, fresh] = tails.try_emplace(path);
      Tail& t = it->second;
      if (fresh && since > 0) t.offset = SinceOffset(path, since);
      const std::string prefix = "[" + fs::path(path).stem().string() + "] ";
      auto print = [&](std::string_view line) {
        std::fwrite(prefix.data(), 1, prefix.size(), stdout);
        std::fwrite(line.data(), 1, line.size(), stdout);
        std::fputc('\n', stdout);
      };
      for (std::string more; !(more = ReadFrom(path, t.offset, kChunk)).empty();) {
        t.offset += static_cast<long>(more.size());
        t.partial += more;
        size_t start = 0;
        for (size_t eol; (eol = t.partial.find('\n', start)) != std::string::npos; start = eol + 1) {
          print(std::string_view(t.partial).substr(start, eol - start));
        }
        t.partial.erase(0, start);
        if (static_cast<int64_t>(t.partial.size()) >= kChunk) {
          print(t.partial);
          t.partial.clear();
        }
      }
      if (last && !t.partial.empty()) {
        print(t.partial);
        t.partial.clear();
      }
    }
    std::fflush(stdout);
  };
  if (!follow) {
    pass(true);
    return kExitOk;
  }
  BlockSupervisorSignals();
  while (runs::Alive(e)) {
    pass(false);
    if (int sig = WaitSignal(std::chrono::milliseconds(200)); IsStopSignal(sig)) return kExitInterrupted;
  }
  pass(true);  // what the last moments wrote
  return kExitOk;
}

// One screen of `top`: every task's CPU, memory and threads over `interval`.
std::string TopScreen(const runs::RunEntry& e, const RunView& v, Duration interval) {
  const auto tasks = SampleTasks(e.pid, interval);
  std::string out = "job " + e.name + ", run " + e.run_id + ": " + RunStateName(v.state) + ", " + Tasks(e) +
                    ", elapsed " + Elapsed(v) + "\n";
  const std::string split = StepSplit(v.dir);
  if (!split.empty()) out += split + "\n";
  // GPU columns where NVML is: the device a task uses, that device's utilization, the task's memory on it.
  const bool gpus = GpusPresent();
  const auto gpu = gpus ? GpuProcesses() : std::vector<GpuUse>{};
  char line[256];
  std::snprintf(line, sizeof line, "\n%-6s %-14s %8s %7s %10s %8s", "RANK", "TASK", "PID", "CPU%", "RSS MiB",
                "THREADS");
  out += line;
  out += gpus ? "  GPU  GPU%  GPU MiB\n" : "\n";
  for (const auto& t : tasks) {
    std::snprintf(line, sizeof line, "%-6d %-14s %8lld %7.1f %10.1f %8d", t.rank, t.label.c_str(),
                  static_cast<long long>(t.pid), t.cpu_percent, t.rss_mib, t.threads);
    out += line;
    if (gpus) {
      std::string cells;
      for (const auto& g : gpu) {
        if (g.pid != t.pid) continue;
        std::snprintf(line, sizeof line, "  %3d  %4d  %7.0f", g.device, g.device_utilization, g.memory_mib);
        cells += line;
      }
      out += cells.empty() ? "    -     -        -" : cells;
    }
    out += "\n";
  }
  if (tasks.empty()) out += "(no task is running)\n";
  return out;
}

int Top(const runs::RunEntry& e, bool once, Duration interval) {
  if (!runs::Alive(e)) {
    return Fail("top",
                InvalidArgument("run " + e.run_id + " of job " + e.name + " is not running (" +
                                RunStateName(View(e).state) + "); trainctl status " + e.run_id + " says how it ended"));
  }
  BlockSupervisorSignals();
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  while (true) {
    const std::string screen = TopScreen(e, View(e), interval);
    if (tty && !once) std::fputs("\x1b[H\x1b[2J", stdout);  // home, clear
    std::fputs(screen.c_str(), stdout);
    std::fflush(stdout);
    if (once || !runs::Alive(e)) return kExitOk;
    if (int sig = WaitSignal(Duration(0)); IsStopSignal(sig)) return kExitOk;
    if (!tty) std::fputs("\n", stdout);
  }
}

// Whether `e`'s pid is that run's trainctl launcher: its start time (runs::Alive), its executable
// (trainctl's), its owner (the caller, unless root calls). A run file names any pid it likes.
Status IsLauncher(const runs::RunEntry& e) {
  const std::string proc = "/proc/" + std::to_string(e.pid);
  std::error_code ec;
  const std::string exe = fs::read_symlink(proc + "/exe", ec).filename().string();
  struct stat st {};
  if (ec || ::stat(proc.c_str(), &st) != 0) return PermissionDenied("cannot inspect pid " + std::to_string(e.pid));
  if (exe.rfind("trainctl", 0) != 0) {
    return PermissionDenied("pid " + std::to_string(e.pid) + ", which run " + e.run_id + "'s file names, is " +
                            Quote(exe) + ", not a trainctl launcher; not signalling it (a planted or stale run file?)");
  }
  if (::geteuid() != 0 && st.st_uid != ::geteuid()) {
    return PermissionDenied("pid " + std::to_string(e.pid) + " belongs to user " + std::to_string(st.st_uid));
  }
  return Status::Ok();
}

int Stop(const runs::RunEntry& e, Duration wait) {
  if (!runs::Alive(e)) {
    return Fail("stop", InvalidArgument("run " + e.run_id + " of job " + e.name + " is not running (" +
                                        RunStateName(View(e).state) + ")"));
  }
  const auto deadline = Clock::now() + wait;
  if (!e.slurm_job_id.empty() && e.slurm_job_id.find_first_not_of("0123456789") != std::string::npos) {
    return Fail("stop", InvalidArgument("run " + e.run_id + ": its Slurm job id " + Quote(e.slurm_job_id) +
                                        " is not a number; not passing it to scancel"));
  }
  if (!e.slurm_job_id.empty()) {
    // Slurm's way: SIGTERM to the batch script (`exec trainctl run`) and its steps, the
    // allocation released; from whichever host of the cluster this runs on.
    std::printf("stopping run %s: scancel %s (a Slurm batch job)\n", e.run_id.c_str(), e.slurm_job_id.c_str());
    SpawnOptions so;
    so.argv = {"scancel", e.slurm_job_id};
    so.env = CurrentEnvironment();
    auto r = RunCommand(so, std::chrono::seconds(30));
    if (!r.ok() || r->exit.code != 0) {
      return Fail("stop",
                  Unavailable("scancel " + e.slurm_job_id + " failed: " + (r.ok() ? r->output : r.status().message())));
    }
    while (runs::Alive(e) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (runs::Alive(e)) {
      std::printf("run %s still running %s after scancel\n", e.run_id.c_str(), FormatDuration(wait).c_str());
      return kExitError;
    }
    std::printf("run %s stopped (%s)\n", e.run_id.c_str(), RunStateName(View(e).state));
    return kExitOk;
  }
  if (!e.host.empty() && e.host != HostName()) {
    // Its pid is another machine's (a home directory shared between hosts): not one to signal here.
    return Fail("stop", InvalidArgument("run " + e.run_id + " of job " + e.name + " runs on " + e.host +
                                        ", not here: stop it there (trainctl stop " + e.run_id + ")"));
  }
  if (Status st = IsLauncher(e); !st.ok()) return Fail("stop", st);
  std::printf("stopping run %s (launcher pid %lld)\n", e.run_id.c_str(), static_cast<long long>(e.pid));
  ::kill(static_cast<pid_t>(e.pid), SIGTERM);
  while (runs::Alive(e) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (runs::Alive(e)) {
    ::kill(static_cast<pid_t>(e.pid), SIGKILL);  // its agents and workers die with it (PDEATHSIG)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int left = KillJobCgroup(e.cgroup);  // and what they started, daemons included
    std::printf("run %s did not stop within %s: killed%s\n", e.run_id.c_str(), FormatDuration(wait).c_str(),
                left > 0 ? (" with the " + std::to_string(left) + " processes left in its cgroup").c_str() : "");
    return kExitError;
  }
  EndOrphans(e);
  std::printf("run %s stopped (%s)\n", e.run_id.c_str(), RunStateName(View(e).state));
  return kExitOk;
}

}  // namespace

bool IsLocalJob(const SpecFlags& flags) {
  return !flags.file.empty() && flags.files.empty() && flags.sets.empty() && !Exists(flags.file);
}

int LocalStatus(const std::string& job, bool as_json) {
  auto e = runs::Find(job);
  if (!e.ok()) return Fail("status", e.status());
  RunView v = View(*e);
  if (as_json) {
    json out = v.status.ToJson();
    out["state"] = RunStateName(v.state);
    out["run_id"] = e->run_id;
    out["output_dir"] = v.dir;
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("job %s, run %s: %s\n", e->name.c_str(), e->run_id.c_str(), RunStateName(v.state));
    std::printf("  tasks     %s on %s (%s)\n", Tasks(*e).c_str(), e->host.c_str(), e->target.c_str());
    std::printf("  elapsed   %s\n", Elapsed(v).c_str());
    std::printf("  progress  %s\n", Progress(v.dir).c_str());
    if (v.status.restarts) std::printf("  restarts  %d\n", *v.status.restarts);
    // As the job's own report said it ("node 1 (host:pid) was lost: ..." for a node, not a task).
    if (v.status.failure) std::printf("  failure   %s\n", v.status.failure->Summary().c_str());
    std::printf("  output    %s\n  logs      trainctl logs %s\n", v.dir.c_str(), e->run_id.c_str());
  }
  if (v.state == RunState::kFailed || v.state == RunState::kLost || v.state == RunState::kError)
    return kExitWorkerFailed;
  return kExitOk;
}

int LocalLogs(const std::string& job, bool follow, int rank, const std::string& role, const std::string& since) {
  int64_t cutoff = 0;
  if (!since.empty()) {
    auto d = ParseDuration(since);
    if (!d.ok() || d->count() <= 0)
      return Fail("logs", InvalidArgument("--since: expected a duration such as 10m or 30s, got " + Quote(since)));
    cutoff = static_cast<int64_t>(std::time(nullptr)) - std::chrono::duration_cast<std::chrono::seconds>(*d).count();
  }
  auto e = runs::Find(job);
  return e.ok() ? Logs(*e, follow, rank, role, cutoff) : Fail("logs", e.status());
}

void AddLocalJobVerbs(CLI::App& app, const GlobalFlags& flags, int* code) {
  (void)flags;
  static bool all = false, ps_json = false;
  auto* ps = app.add_subcommand("ps",
                                "This user's jobs on this machine, running and recent: name, run id, "
                                "state, tasks, progress, elapsed time, output directory");
  ps->add_flag("-a,--all", all, "every run in the index, not only the newest of each job");
  ps->add_flag("--json", ps_json, "print JSON");
  ps->callback([code] { *code = Ps(all, ps_json); });

  static std::string top_job, top_every = "1s";
  static bool top_once = false;
  auto* top = app.add_subcommand("top",
                                 "A running job's tasks: CPU %, memory and threads of each, steps/s and "
                                 "where a step's time goes (data, compute, communication); live");
  top->add_option("job", top_job, "a job name (its newest run) or a run id")->required();
  top->add_option("--interval", top_every, "time between screens (and the CPU sampling window)")->capture_default_str();
  top->add_flag("--once", top_once, "print one screen and exit");
  top->callback([code] {
    auto every = ParseDuration(top_every);
    if (!every.ok() || every->count() <= 0) {
      *code = Fail("top", InvalidArgument("--interval: expected a duration such as 1s or 500ms"));
      return;
    }
    auto e = runs::Find(top_job);
    *code = e.ok() ? Top(*e, top_once, *every) : Fail("top", e.status());
  });

  static monitor::DashboardOptions dash;
  auto* dashboard =
      app.add_subcommand("dashboard",
                         "A web page of this user's jobs on this machine (live curves, workers, failures, logs, eval "
                         "results) and their Prometheus metrics at /metrics, on 127.0.0.1 with a token in the URL");
  dashboard
      ->add_option("--host", dash.host,
                   "the address to listen on (another than loopback exposes it, "
                   "still behind the token)")
      ->capture_default_str();
  dashboard->add_option("--port", dash.port, "the port (0: any free one)")->capture_default_str();
  dashboard->callback([code] {
    dash.token = RandomHex(24);
    dash.self_exe = SelfExe();
    BlockSupervisorSignals();  // before the server's threads start: they inherit the mask
    auto server = monitor::Dashboard::Start(dash);
    if (!server.ok()) {
      *code = Fail("dashboard", server.status());
      return;
    }
    std::printf("trainctl dashboard: %s\n(Prometheus: scrape /metrics with the bearer token %s; Ctrl-C stops it)\n",
                (*server)->Url().c_str(), dash.token.c_str());
    std::fflush(stdout);
    while (true) {
      if (int sig = WaitSignal(std::chrono::seconds(1)); IsStopSignal(sig)) break;
    }
    *code = kExitOk;
  });

  static std::string stop_job;
  static std::string stop_wait = "60s";
  auto* stop = app.add_subcommand("stop",
                                  "Stop a job running on this machine (as Ctrl-C in its terminal "
                                  "would): every agent and worker, with its grace period");
  stop->add_option("job", stop_job, "a job name (its newest run) or a run id")->required();
  stop->add_option("--timeout", stop_wait, "how long to wait before killing the launcher")->capture_default_str();
  stop->callback([code] {
    auto wait = ParseDuration(stop_wait);
    if (!wait.ok()) {
      *code = Fail("stop", InvalidArgument("--timeout: " + wait.status().message()));
      return;
    }
    auto e = runs::Find(stop_job);
    *code = e.ok() ? Stop(*e, *wait) : Fail("stop", e.status());
  });
}

}  // namespace trainctl::cli
