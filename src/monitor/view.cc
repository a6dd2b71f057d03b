// What trainctl shows about a run (cli's ps/status/top, the dashboard): read from the run index,
// the run's output directory and /proc; nothing here writes.
#include "monitor/view.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <thread>

#include "common/fs.h"
#include "common/json_field.h"
#include "common/strings.h"
#include "job/paths.h"

namespace trainctl::monitor {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

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

}  // namespace

json ReadJson(const std::string& path) {
  auto text = ReadFile(path, 1 << 20);
  return text.ok() ? json::parse(*text, nullptr, false) : json();
}

RunView View(const runs::RunEntry& e) {
  RunView v{e, ReadRunStatus(e.output_dir), RunState::kUnknown, runs::Alive(e), e.output_dir};
  if (v.status.run_id != e.run_id) {
    const std::string moved = e.output_dir + "/previous/" + e.run_id;
    if (v.alive || !IsDirectory(moved)) {
      v.state = v.alive ? RunState::kStarting : RunState::kUnknown;
      return v;
    }
    v.dir = moved;  // a later run moved its files aside; its launcher is gone (not alive)
    v.status = ReadRunStatus(moved);
  }
  v.state = v.status.state;
  if (v.state == RunState::kRunning && !v.alive) v.state = RunState::kLost;  // killed before it could say how it ended
  return v;
}

std::string Elapsed(const RunView& v) {
  if (v.state == RunState::kRunning || v.state == RunState::kStarting) {
    return FormatDuration(std::chrono::seconds(std::max<int64_t>(0, std::time(nullptr) - v.entry.started)));
  }
  return v.status.elapsed.empty() ? "-" : v.status.elapsed;
}

// "epoch 3 step 1200 loss 0.412 acc 0.91" from the end of metrics.jsonl (the built-in trainer).
std::string Progress(const std::string& output_dir) {
  const std::string tail = ReadTail(paths::MetricsJsonl(output_dir), 16384);
  double epoch = -1, step = -1, loss = -1, acc = -1;
  for (const auto& line : SplitLines(tail)) {
    auto j = json::parse(line, nullptr, false);
    epoch = JsonField(j, "epoch", epoch);
    step = JsonField(j, "step", step);
    loss = JsonField(j, "loss", loss);
    acc = JsonField(j, "test_accuracy", acc);
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

// The log files of a run: <role>-<index>.log, in task order (worker-0, worker-1, ..., worker-10).
std::vector<std::string> LogFiles(const std::string& dir, const std::string& role, int rank, const json& spec) {
  std::vector<std::pair<std::pair<std::string, int>, std::string>> found;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const std::string stem = f.path().stem().string();
    const size_t dash = stem.rfind('-');
    if (f.path().extension() != ".log" || dash == std::string::npos) continue;
    // What trainctl wrote: a regular file, not a link planted to show another file (/etc/shadow).
    if (!fs::is_regular_file(f.symlink_status(ec))) continue;
    found.push_back({{stem.substr(0, dash), std::atoi(stem.c_str() + dash + 1)}, f.path().string()});
  }
  // Ranks number the tasks role by role (spec order), then by index.
  std::map<std::string, int> first_rank;
  int next = 0;
  if (spec.is_object() && spec.contains("roles") && spec["roles"].is_array()) {
    for (const auto& r : spec["roles"]) {
      first_rank[JsonField(r, "name", "")] = next;
      next += JsonField(r, "replicas", 1);
    }
  }
  auto rank_of = [&](const std::pair<std::string, int>& task) {
    auto it = first_rank.find(task.first);
    return (it == first_rank.end() ? 0 : it->second) + task.second;
  };
  std::sort(found.begin(), found.end(),
            [&](const auto& a, const auto& b) { return rank_of(a.first) < rank_of(b.first); });
  std::vector<std::string> out;
  for (const auto& [task, path] : found) {
    if (!role.empty() && task.first != role) continue;
    if (rank >= 0 && rank_of(task) != rank) continue;
    out.push_back(path);
  }
  return out;
}

void JsonLinesFollower::Read(const std::string& path, const std::function<void()>& start_over,
                             const std::function<void(const nlohmann::json&)>& each) {
  struct stat st {};
  if (path != path_ || (::stat(path.c_str(), &st) == 0 && st.st_size < offset_)) {
    path_ = path;
    offset_ = 0;
    start_over();
  }
  constexpr int64_t kChunk = 4 << 20;  // a read's most: no metrics line is longer
  const std::string text = ReadFrom(path, offset_, kChunk);
  const size_t end = text.rfind('\n');  // whole lines only; the rest is read next time
  if (end == std::string::npos) {
    if (static_cast<int64_t>(text.size()) == kChunk) offset_ += kChunk;  // no line at all: skipped
    return;
  }
  offset_ += static_cast<int64_t>(end + 1);
  for (size_t start = 0, eol; start <= end && (eol = text.find('\n', start)) != std::string::npos; start = eol + 1) {
    auto j = nlohmann::json::parse(text.begin() + static_cast<long>(start), text.begin() + static_cast<long>(eol),
                                   nullptr, false);
    if (j.is_object()) each(j);
  }
}

// The newest window of the trainer's metrics: steps/s and where a step's time goes.
std::string StepSplit(const std::string& output_dir) {
  const auto lines = SplitLines(ReadTail(paths::MetricsJsonl(output_dir), 65536));
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    auto j = json::parse(*it, nullptr, false);
    if (!j.is_object() || !j.contains("window_seconds")) continue;
    auto num = [&j](const char* key) { return JsonField(j, key, 0.0); };
    const double secs = num("window_seconds"), steps = num("window_steps");
    if (secs <= 0 || steps <= 0) continue;
    const double data = 100 * num("data_seconds") / secs, comm = 100 * num("comm_seconds") / secs;
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "step %.0f: %.1f steps/s, %.0f samples/s; a step: %.0f %% data, %.0f %% compute, "
                  "%.0f %% communication (rank 0, last %.0f steps)",
                  num("step"), steps / secs, num("samples_per_s"), data, std::max(0.0, 100 - data - comm), comm, steps);
    std::string line = buf;
    if (j.contains("slowest_rank")) {  // the rank the others waited for: the one that waited least
      std::snprintf(buf, sizeof buf, "; slowest rank %.0f (waiting %.0f %%, the others up to %.0f %%)",
                    num("slowest_rank"), 100 * num("comm_seconds_min") / secs, 100 * num("comm_seconds_max") / secs);
      line += buf;
    }
    if (j.contains("batch_max")) {  // trainer.balance: speed
      std::snprintf(buf, sizeof buf, "; batch split by speed: %.0f to %.0f a rank", num("batch_min"), num("batch_max"));
      line += buf;
    }
    return line;
  }
  return "";
}

std::vector<TaskStats> SampleTasks(int64_t launcher_pid, Duration interval) {
  auto before = SampleAll();
  const auto t0 = Clock::now();
  const auto tasks = FindTasks(launcher_pid, before);
  std::this_thread::sleep_for(interval);
  const double secs = SecondsSince(t0);
  auto after = SampleAll();
  std::vector<TaskStats> out;
  for (const auto& t : tasks) {
    TaskStats s{t.rank, t.label, t.pid};
    int64_t rss = 0;
    double cpu = 0;
    for (int64_t pid : t.tree) {
      auto a = after.find(pid);
      if (a == after.end()) continue;
      auto b = before.find(pid);
      cpu += a->second.cpu_seconds - (b == before.end() ? 0 : b->second.cpu_seconds);
      rss += a->second.rss_kb;
      s.threads += a->second.threads;
    }
    s.cpu_percent = 100 * cpu / std::max(1e-3, secs);
    s.rss_mib = rss / 1024.0;
    out.push_back(s);
  }
  return out;
}

}  // namespace trainctl::monitor
