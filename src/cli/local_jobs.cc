// Jobs run on this machine, watched from any terminal: ps, status, logs and stop, from the run
// index (job/runs.h) and each run's output directory.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/verbs.h"
#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "job/paths.h"
#include "job/runs.h"

namespace trainctl::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json ReadJson(const std::string& path) {
  auto text = ReadFile(path, 1 << 20);
  return text.ok() ? json::parse(*text, nullptr, false) : json();
}

// A run's state: its status.json, corrected for a launcher that is gone without writing the end.
// `dir` holds the run's files: its output_dir, or previous/<run id>/ there once a later run has
// moved them aside.
struct RunView {
  runs::RunEntry entry;
  json status;
  std::string state;
  bool alive = false;
  std::string dir;
};

RunView View(const runs::RunEntry& e) {
  RunView v{e, ReadJson(paths::StatusJson(e.output_dir)), "", runs::Alive(e), e.output_dir};
  const bool ours = v.status.is_object() && v.status.value("run_id", "") == e.run_id;
  if (!ours) {
    const std::string moved = e.output_dir + "/previous/" + e.run_id;
    if (v.alive || !IsDirectory(moved)) {
      v.state = v.alive ? "starting" : "unknown";
      return v;
    }
    v.dir = moved;
    v.status = ReadJson(paths::StatusJson(moved));
    v.state = v.status.is_object() ? v.status.value("state", "unknown") : "unknown";
    if (v.state == "running") v.state = "lost";
    return v;
  }
  v.state = v.status.value("state", "unknown");
  if (v.state == "running" && !v.alive) v.state = "lost";  // killed before it could say how it ended
  return v;
}

std::string Elapsed(const RunView& v) {
  if (v.state == "running" || v.state == "starting") {
    return FormatDuration(std::chrono::seconds(std::max<int64_t>(0, std::time(nullptr) - v.entry.started)));
  }
  return v.status.is_object() ? v.status.value("elapsed", "-") : "-";
}

// "epoch 3 step 1200 loss 0.412 acc 0.91" from the end of metrics.jsonl (the built-in trainer).
std::string Progress(const std::string& output_dir) {
  const std::string path = paths::MetricsJsonl(output_dir);
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return "-";
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  const long from = std::max(0L, size - 16384);
  std::fseek(f, from, SEEK_SET);
  std::string tail(size - from, '\0');
  tail.resize(std::fread(tail.data(), 1, tail.size(), f));
  std::fclose(f);
  double epoch = -1, step = -1, loss = -1, acc = -1;
  for (const auto& line : SplitLines(tail)) {
    auto j = json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    if (j.contains("epoch") && j["epoch"].is_number()) epoch = j["epoch"].get<double>();
    if (j.contains("step") && j["step"].is_number()) step = j["step"].get<double>();
    if (j.contains("loss") && j["loss"].is_number()) loss = j["loss"].get<double>();
    if (j.contains("test_accuracy") && j["test_accuracy"].is_number()) acc = j["test_accuracy"].get<double>();
  }
  if (epoch < 0) return "-";
  char buf[128];
  int n = std::snprintf(buf, sizeof buf, "epoch %.0f step %.0f", epoch, step);
  if (loss >= 0) n += std::snprintf(buf + n, sizeof buf - n, " loss %.4f", loss);
  if (acc >= 0) std::snprintf(buf + n, sizeof buf - n, " acc %.4f", acc);
  return buf;
}

std::string Tasks(const runs::RunEntry& e) {
  if (e.procs_per_node > 0) return std::to_string(e.nodes) + "x" + std::to_string(e.procs_per_node);
  return std::to_string(e.tasks) + " tasks";
}

void Row(const std::vector<std::string>& cells, const std::vector<size_t>& widths) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) {
    line += cells[i];
    if (i + 1 < cells.size()) line += std::string(widths[i] > cells[i].size() ? widths[i] - cells[i].size() + 2 : 2, ' ');
  }
  std::printf("%s\n", line.c_str());
}

int Ps(bool all, bool as_json) {
  auto entries = runs::List();
  std::vector<std::vector<std::string>> rows;
  json out = json::array();
  std::map<std::string, int> shown;  // without --all: the newest run of each job, and live ones
  for (const auto& e : entries) {
    RunView v = View(e);
    if (!all && !v.alive && shown[e.name]++ > 0) continue;
    const std::string progress = Progress(v.dir);
    out.push_back({{"name", e.name}, {"run_id", e.run_id}, {"state", v.state}, {"tasks", Tasks(e)},
                   {"progress", progress}, {"elapsed", Elapsed(v)}, {"output_dir", v.dir},
                   {"pid", v.alive ? e.pid : 0}});
    rows.push_back({e.name, e.run_id, v.state, Tasks(e), progress, Elapsed(v), v.dir});
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

int Fail(const std::string& verb, const Status& st) {
  std::fprintf(stderr, "trainctl %s: %s\n", verb.c_str(), st.message().c_str());
  return st.code() == Code::kNotFound || st.code() == Code::kInvalidArgument ? kExitInvalidSpec : kExitError;
}

// The log files of a run: <role>-<index>.log, in task order (worker-0, worker-1, ..., worker-10).
std::vector<std::string> LogFiles(const std::string& dir, const std::string& role, int rank, const json& spec) {
  std::vector<std::pair<std::pair<std::string, int>, std::string>> found;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const std::string stem = f.path().stem().string();
    const size_t dash = stem.rfind('-');
    if (f.path().extension() != ".log" || dash == std::string::npos) continue;
    found.push_back({{stem.substr(0, dash), std::atoi(stem.c_str() + dash + 1)}, f.path().string()});
  }
  // Ranks number the tasks role by role (spec order), then by index.
  std::map<std::string, int> first_rank;
  int next = 0;
  if (spec.is_object() && spec.contains("roles") && spec["roles"].is_array()) {
    for (const auto& r : spec["roles"]) {
      first_rank[r.value("name", "")] = next;
      next += r.value("replicas", 1);
    }
  }
  auto rank_of = [&](const std::pair<std::string, int>& task) {
    auto it = first_rank.find(task.first);
    return (it == first_rank.end() ? 0 : it->second) + task.second;
  };
  std::sort(found.begin(), found.end(), [&](const auto& a, const auto& b) { return rank_of(a.first) < rank_of(b.first); });
  std::vector<std::string> out;
  for (const auto& [task, path] : found) {
    if (!role.empty() && task.first != role) continue;
    if (rank >= 0 && rank_of(task) != rank) continue;
    out.push_back(path);
  }
  return out;
}

int Logs(const runs::RunEntry& e, bool follow, int rank, const std::string& role) {
  const RunView v = View(e);
  const std::string dir = paths::LogsDir(v.dir);
  if (!IsDirectory(dir)) return Fail("logs", NotFound("run " + e.run_id + " has no logs in " + dir));
  const json spec = ReadJson(paths::JobJson(v.dir));
  struct Tail {
    long offset = 0;
    std::string partial;
  };
  std::map<std::string, Tail> tails;
  // Prints what each file gained since the last pass, whole lines only, each once.
  auto pass = [&](bool last) {
    for (const auto& path : LogFiles(dir, role, rank, spec)) {
      Tail& t = tails[path];
      std::FILE* f = std::fopen(path.c_str(), "r");
      if (!f) continue;
      std::fseek(f, t.offset, SEEK_SET);
      char buf[65536];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
        t.offset += static_cast<long>(n);
        t.partial.append(buf, n);
      }
      std::fclose(f);
      const std::string prefix = "[" + fs::path(path).stem().string() + "] ";
      size_t start = 0;
      for (size_t eol; (eol = t.partial.find('\n', start)) != std::string::npos; start = eol + 1) {
        std::printf("%s%s\n", prefix.c_str(), t.partial.substr(start, eol - start).c_str());
      }
      t.partial.erase(0, start);
      if (last && !t.partial.empty()) {
        std::printf("%s%s\n", prefix.c_str(), t.partial.c_str());
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
    if (int sig = WaitSignal(std::chrono::milliseconds(200)); sig && sig != SIGCHLD) return kExitInterrupted;
  }
  pass(true);  // what the last moments wrote
  return kExitOk;
}

// One process's counters from /proc.
struct ProcSample {
  int64_t pid = 0, ppid = 0;
  double cpu_seconds = 0;  // utime + stime
  int64_t rss_kb = 0;
  int threads = 0;
};

bool SampleProc(int64_t pid, ProcSample* out) {
  auto stat = ReadFile("/proc/" + std::to_string(pid) + "/stat", 1 << 14);
  if (!stat.ok()) return false;
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) return false;
  std::vector<std::string> f = Split(std::string_view(*stat).substr(close + 2), ' ');  // f[0]: field 3
  if (f.size() < 22) return false;
  static const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  out->pid = pid;
  out->ppid = std::atoll(f[1].c_str());
  out->cpu_seconds = (std::atof(f[11].c_str()) + std::atof(f[12].c_str())) / ticks;
  out->threads = std::atoi(f[17].c_str());
  out->rss_kb = std::atoll(f[21].c_str()) * (::sysconf(_SC_PAGESIZE) / 1024);
  return true;
}

// Every process on the machine, by pid (this user's are readable; enough for our own job).
std::map<int64_t, ProcSample> SampleAll() {
  std::map<int64_t, ProcSample> all;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    ProcSample p;
    if (SampleProc(std::atoll(name.c_str()), &p)) all[p.pid] = p;
  }
  return all;
}

// The job's tasks: the launcher's descendants whose environment says which task they are
// (RANK, ROLE_NAME, ROLE_RANK), each with its own descendants (a DataLoader's workers).
struct TaskProc {
  int rank = -1;
  std::string label;  // worker-0, ps-1
  int64_t pid = 0;
  std::vector<int64_t> tree;
};

std::vector<TaskProc> FindTasks(int64_t launcher, const std::map<int64_t, ProcSample>& all) {
  std::map<int64_t, std::vector<int64_t>> children;
  for (const auto& [pid, p] : all) children[p.ppid].push_back(pid);
  std::vector<TaskProc> tasks;
  std::vector<int64_t> stack = {launcher};
  while (!stack.empty()) {
    const int64_t pid = stack.back();
    stack.pop_back();
    auto env = ReadFile("/proc/" + std::to_string(pid) + "/environ", 1 << 20);
    std::map<std::string, std::string> vars;
    if (env.ok()) {
      for (const auto& kv : Split(*env, '\0')) {
        const size_t eq = kv.find('=');
        if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
    }
    if (pid != launcher && vars.count("RANK") && vars.count("ROLE_NAME") && vars.count("TORCHELASTIC_RUN_ID")) {
      TaskProc t;
      t.rank = std::atoi(vars["RANK"].c_str());
      t.label = vars["ROLE_NAME"] + "-" + vars["ROLE_RANK"];
      t.pid = pid;
      std::vector<int64_t> sub = {pid};
      while (!sub.empty()) {
        const int64_t p = sub.back();
        sub.pop_back();
        t.tree.push_back(p);
        for (int64_t c : children[p]) sub.push_back(c);
      }
      tasks.push_back(t);
      continue;
    }
    for (int64_t c : children[pid]) stack.push_back(c);
  }
  std::sort(tasks.begin(), tasks.end(), [](const TaskProc& a, const TaskProc& b) { return a.rank < b.rank; });
  return tasks;
}

// The newest window of the trainer's metrics: steps/s and where a step's time goes.
std::string StepSplit(const std::string& output_dir) {
  auto text = ReadFile(paths::MetricsJsonl(output_dir), int64_t{1} << 30);
  if (!text.ok()) return "";
  const auto lines = SplitLines(text->size() > 65536 ? text->substr(text->size() - 65536) : *text);
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    auto j = json::parse(*it, nullptr, false);
    if (!j.is_object() || !j.contains("window_seconds")) continue;
    const double secs = j.value("window_seconds", 0.0), steps = j.value("window_steps", 0.0);
    if (secs <= 0 || steps <= 0) continue;
    const double data = 100 * j.value("data_seconds", 0.0) / secs, comm = 100 * j.value("comm_seconds", 0.0) / secs;
    char buf[256];
    std::snprintf(buf, sizeof buf, "step %.0f: %.1f steps/s, %.0f samples/s; a step: %.0f %% data, %.0f %% compute, "
                  "%.0f %% communication (rank 0, last %.0f steps)",
                  j.value("step", 0.0), steps / secs, j.value("samples_per_s", 0.0), data,
                  std::max(0.0, 100 - data - comm), comm, steps);
    return buf;
  }
  return "";
}

// One screen of `top`: every task's CPU, memory and threads over `interval`.
std::string TopScreen(const runs::RunEntry& e, const RunView& v, Duration interval) {
  auto before = SampleAll();
  const auto t0 = Clock::now();
  const auto tasks = FindTasks(e.pid, before);
  std::this_thread::sleep_for(interval);
  const double secs = SecondsSince(t0);
  auto after = SampleAll();
  std::string out = "job " + e.name + ", run " + e.run_id + ": " + v.state + ", " + Tasks(e) + ", elapsed " + Elapsed(v) + "\n";
  const std::string split = StepSplit(v.dir);
  if (!split.empty()) out += split + "\n";
  char line[256];
  std::snprintf(line, sizeof line, "\n%-6s %-14s %8s %7s %10s %8s\n", "RANK", "TASK", "PID", "CPU%", "RSS MiB", "THREADS");
  out += line;
  for (const auto& t : tasks) {
    double cpu = 0;
    int64_t rss = 0;
    int threads = 0;
    for (int64_t pid : t.tree) {
      auto a = after.find(pid);
      if (a == after.end()) continue;
      auto b = before.find(pid);
      cpu += a->second.cpu_seconds - (b == before.end() ? 0 : b->second.cpu_seconds);
      rss += a->second.rss_kb;
      threads += a->second.threads;
    }
    std::snprintf(line, sizeof line, "%-6d %-14s %8lld %7.1f %10.1f %8d\n", t.rank, t.label.c_str(),
                  static_cast<long long>(t.pid), 100 * cpu / std::max(1e-3, secs), rss / 1024.0, threads);
    out += line;
  }
  if (tasks.empty()) out += "(no task is running)\n";
  return out;
}

int Top(const runs::RunEntry& e, bool once, Duration interval) {
  if (!runs::Alive(e)) {
    return Fail("top", InvalidArgument("run " + e.run_id + " of job " + e.name + " is not running (" + View(e).state +
                                       "); trainctl status " + e.run_id + " says how it ended"));
  }
  BlockSupervisorSignals();
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  while (true) {
    const std::string screen = TopScreen(e, View(e), interval);
    if (tty && !once) std::fputs("\x1b[H\x1b[2J", stdout);  // home, clear
    std::fputs(screen.c_str(), stdout);
    std::fflush(stdout);
    if (once || !runs::Alive(e)) return kExitOk;
    if (int sig = WaitSignal(Duration(0)); sig && sig != SIGCHLD) return kExitOk;
    if (!tty) std::fputs("\n", stdout);
  }
}

int Stop(const runs::RunEntry& e, Duration wait) {
  if (!runs::Alive(e)) {
    return Fail("stop", InvalidArgument("run " + e.run_id + " of job " + e.name + " is not running (" +
                                        View(e).state + ")"));
  }
  std::printf("stopping run %s (launcher pid %lld)\n", e.run_id.c_str(), static_cast<long long>(e.pid));
  ::kill(static_cast<pid_t>(e.pid), SIGTERM);
  const auto deadline = Clock::now() + wait;
  while (runs::Alive(e) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (runs::Alive(e)) {
    ::kill(static_cast<pid_t>(e.pid), SIGKILL);  // its agents and workers die with it (PDEATHSIG)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::printf("run %s did not stop within %s: killed\n", e.run_id.c_str(), FormatDuration(wait).c_str());
    return kExitError;
  }
  std::printf("run %s stopped (%s)\n", e.run_id.c_str(), View(e).state.c_str());
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
    json out = v.status.is_object() ? v.status : json::object();
    out["state"] = v.state;
    out["run_id"] = e->run_id;
    out["output_dir"] = v.dir;
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("job %s, run %s: %s\n", e->name.c_str(), e->run_id.c_str(), v.state.c_str());
    std::printf("  tasks     %s on %s (%s)\n", Tasks(*e).c_str(), e->host.c_str(), e->target.c_str());
    std::printf("  elapsed   %s\n", Elapsed(v).c_str());
    std::printf("  progress  %s\n", Progress(v.dir).c_str());
    if (v.status.is_object() && v.status.contains("restarts")) {
      std::printf("  restarts  %d\n", v.status.value("restarts", 0));
    }
    if (v.status.is_object() && v.status.contains("failure") && v.status["failure"].is_object()) {
      const json& f = v.status["failure"];
      std::printf("  failure   %s %d (rank %d on %s): %s\n", f.value("role", "").c_str(), f.value("task_index", 0),
                  f.value("rank", -1), f.value("host", "").c_str(), f.value("exit", "").c_str());
    }
    std::printf("  output    %s\n  logs      trainctl logs %s\n", v.dir.c_str(), e->run_id.c_str());
  }
  if (v.state == "failed" || v.state == "lost" || v.state == "error") return kExitWorkerFailed;
  return kExitOk;
}

int LocalLogs(const std::string& job, bool follow, int rank, const std::string& role) {
  auto e = runs::Find(job);
  return e.ok() ? Logs(*e, follow, rank, role) : Fail("logs", e.status());
}

void AddLocalJobVerbs(CLI::App& app, const GlobalFlags& flags, int* code) {
  (void)flags;
  static bool all = false, ps_json = false;
  auto* ps = app.add_subcommand("ps", "This user's jobs on this machine, running and recent: name, run id, "
                                      "state, tasks, progress, elapsed time, output directory");
  ps->add_flag("-a,--all", all, "every run in the index, not only the newest of each job");
  ps->add_flag("--json", ps_json, "print JSON");
  ps->callback([code] { *code = Ps(all, ps_json); });

  static std::string top_job, top_every = "1s";
  static bool top_once = false;
  auto* top = app.add_subcommand("top", "A running job's tasks: CPU %, memory and threads of each, steps/s and "
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

  static std::string stop_job;
  static std::string stop_wait = "60s";
  auto* stop = app.add_subcommand("stop", "Stop a job running on this machine (as Ctrl-C in its terminal "
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
