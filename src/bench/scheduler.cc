#include "bench/scheduler.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "bench/report.h"
#include "bench/upload.h"
#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "job/paths.h"
#include "job/run_status.h"
#include "render/slurm/sbatch.h"

namespace trainctl::bench {
namespace {

struct Running {
  size_t index;  // into the experiments
  pid_t pid;
  Clock::time_point start;
};

// A peer's JSON lines (its stdout) become its metrics.jsonl: the same keys as the trainer's
// (epoch_seconds, epoch_samples_per_s, test_accuracy, peak_rss_mb, time) give the same figures.
void PeerMetrics(const std::string& out) {
  auto text = ReadFile(out + "/stdout.log", int64_t{256} << 20);
  if (!text.ok()) return;
  std::string jsonl;
  for (const auto& line : SplitLines(*text)) {
    const size_t brace = line.find('{');  // after a launcher's prefix, such as torchrun's "[default0]:"
    if (brace == std::string::npos) continue;
    auto j = nlohmann::json::parse(line.substr(brace), nullptr, false);
    if (j.is_object()) jsonl += j.dump() + "\n";
  }
  (void)AtomicWriteFile(paths::MetricsJsonl(out), jsonl);
}

// Why a run failed, from the end of its output: the last exception or error line (Python's
// "ValueError: ...", torchrun's "error: ..."), else the last line with words in it, not a
// banner of "====" that torchrun prints after the error. ": LINE", or "" for no output.
std::string Why(const std::string& log) {
  static const std::regex error(R"(^\s*(\w+\.)*\w*(Error|Exception|Interrupt)\b.*:|\berror\b|\bERROR\b)",
                                std::regex::icase);
  const auto lines = SplitLines(ReadTail(log, 8000));
  std::string words;
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    // torchrun's own exception, after its workers' (which is what failed), says only that they did.
    if (it->find("ChildFailedError") != std::string::npos) continue;
    if (std::regex_search(*it, error)) return ": " + *it;
    if (words.empty() && std::any_of(it->begin(), it->end(), [](unsigned char c) { return std::isalnum(c); }))
      words = *it;
  }
  return words.empty() ? "" : ": " + words;
}

}  // namespace

class Scheduler::Impl {
 public:
  Impl(Matrix m, std::string dir, std::string base_file, Check check)
      : m_(std::move(m)), dir_(std::move(dir)), base_(std::move(base_file)), check_(std::move(check)) {}

  // Resolves every experiment's spec before anything runs: a bad point stops the bench at once.
  Status Prepare(const std::vector<Figures>& done) {
    exps_ = Experiments(m_);
    std::map<std::string, Figures> kept;
    for (const auto& f : done) {
      if (f.state == "succeeded" || f.state == "failed") kept[f.id] = f;
    }
    std::string errors;
    std::map<std::string, int> workers;           // by point
    std::vector<JobSpec> resolved(exps_.size());  // each experiment's spec, with its own output directory
    for (size_t i = 0; i < exps_.size(); ++i) {
      const Experiment& e = exps_[i];
      Figures f;
      f.id = e.id;
      f.system = e.system;
      f.point = e.point;
      f.repeat = e.repeat;
      const std::string key = Key(e.point);
      const bool first = !workers.count(key);
      if (first || (e.system == "trainctl" && workers[key] > 0)) {
        auto spec = ExperimentSpec(m_, base_, e.point, Out(e), e.repeat);
        if (!spec.ok()) {
          errors += "point {" + key + "}:\n" + spec.status().message() + "\n";
          workers[key] = 0;
        } else {
          const Status checked = check_(&*spec, base_, /*preflight=*/first);
          if (first) {
            if (!checked.ok()) errors += "point {" + key + "}:\n" + checked.message() + "\n";
            workers[key] = spec->world_size();
            nodes_[key] = spec->nodes.max;
          }
          resolved[i] = std::move(*spec);
        }
      }
      f.workers = e.workers > 0 ? e.workers : workers[key];
      if (auto it = kept.find(e.id); it != kept.end()) f = it->second;
      figures_.push_back(f);
    }
    if (!errors.empty()) return InvalidArgument(errors);
    for (size_t i = 0; i < exps_.size(); ++i) {
      const Experiment& e = exps_[i];
      const std::string config = dir_ + "/experiments/" + e.id + "/config";
      RETURN_IF_ERROR(MakeDirs(config));
      std::string point = "system: " + e.system + "\nrepeat: " + std::to_string(e.repeat + 1) + "\n";
      for (const auto& [k, v] : e.point) point += k + ": " + v + "\n";
      RETURN_IF_ERROR(AtomicWriteFile(config + "/point.yaml", point));
      if (e.system == "trainctl") {
        // The spec as trainctl resolved it: what runs (with this experiment's output directory).
        RETURN_IF_ERROR(AtomicWriteFile(config + "/job.json", JobSpecToJson(resolved[i], 2) + "\n"));
        if (m_.target == "slurm") {
          RETURN_IF_ERROR(AtomicWriteFile(config + "/job.sbatch",
                                          slurm::SbatchScript(resolved[i], {config + "/job.json"}, SelfExe()), 0755));
        }
      } else {
        RETURN_IF_ERROR(AtomicWriteFile(config + "/command.json", nlohmann::json(e.command).dump() + "\n"));
      }
    }
    return WriteResults(dir_, m_, figures_);
  }

  // Runs what is not done yet; returns the bench's exit code.
  int Run(const std::string& self) {
    BlockSupervisorSignals();
    const auto bench_start = Clock::now();
    std::vector<Running> running;
    size_t next = 0;
    bool stopping = false;
    auto start_next = [&] {
      while (!stopping && running.size() < static_cast<size_t>(m_.parallel) && next < exps_.size()) {
        const size_t i = next++;
        if (figures_[i].state == "succeeded" || figures_[i].state == "failed") continue;
        Start(self, i, &running);
      }
    };
    start_next();
    while (!running.empty()) {
      int sig = WaitSignal(std::chrono::milliseconds(100));
      if (IsStopSignal(sig) || StopSignal()) {
        if (!stopping) {
          stopping = true;
          std::fprintf(stderr, "trainctl bench: stopping %zu running experiment(s); partial results are kept\n",
                       running.size());
          for (const auto& r : running) Stop(r);
          stop_deadline_ = Clock::now() + std::chrono::seconds(60);
        }
      }
      if (stopping && Clock::now() > stop_deadline_) {
        for (const auto& r : running) ::kill(-r.pid, SIGKILL);
      }
      for (size_t k = 0; k < running.size();) {
        int status = 0;
        if (::waitpid(running[k].pid, &status, WNOHANG) != running[k].pid) {
          ++k;
          continue;
        }
        Finish(running[k], ExitInfo::FromWaitStatus(status), stopping);
        running.erase(running.begin() + k);
      }
      start_next();
    }
    // The writes after each experiment are progress (this one rewrites them all); this one is the
    // result set, and a bench whose results could not be written has failed.
    if (Status st = WriteResults(dir_, m_, figures_); !st.ok()) {
      std::fprintf(stderr, "trainctl bench: the results could not be written: %s\n", st.message().c_str());
      return kExitError;
    }
    int failed = 0;
    for (const auto& f : figures_) failed += f.state != "succeeded";
    auto summary = ReadFile(dir_ + "/summary.md");
    if (summary.ok()) std::printf("%s\n", summary->c_str());
    // Bench's own cost: its time outside the experiments it ran (start-up, resolving, writing
    // results after each), against theirs.
    const double inside = inside_;
    const double total = SecondsSince(bench_start);
    if (inside > 0 && m_.parallel == 1) {
      std::printf("bench's own time: %.3f s beside %.3f s of experiments (%.2f %%)\n", total - inside, inside,
                  100 * (total - inside) / inside);
    }
    std::printf("results: %s (report.html, summary.md, results.csv, results.json)\n", dir_.c_str());
    const bool uploaded = Upload();
    if (stopping || StopSignal()) return kExitInterrupted;
    return failed || !uploaded ? kExitError : kExitOk;
  }

  // The result set of experiments that ran elsewhere (the Argo workflow's pods): each one's state
  // from its own records (a trainctl job's status.json, a peer's exit_code), its figures as a run
  // here would give them. Returns 0 once the results are written, however the experiments ended.
  int Collect() {
    for (size_t i = 0; i < exps_.size(); ++i) {
      const Experiment& e = exps_[i];
      Figures& f = figures_[i];
      const std::string out = Out(e);
      if (e.system == "trainctl") {
        const RunState state = ReadRunStatus(out).state;
        f.state = state == RunState::kUnknown     ? "pending"
                  : state == RunState::kSucceeded ? "succeeded"
                  : state == RunState::kRunning   ? "interrupted"
                                                  : "failed";
        f.exit_code = f.state == "succeeded" ? 0 : -1;
      } else {
        auto code = ReadFile(out + "/exit_code");
        f.state = !code.ok() ? "pending" : std::atoi(code->c_str()) == 0 ? "succeeded" : "failed";
        f.exit_code = code.ok() ? std::atoi(code->c_str()) : -1;
        PeerMetrics(out);
        if (f.state == "failed") f.failure = "exit code " + std::to_string(f.exit_code) + Why(out + "/stdout.log");
      }
      ReadFigures(out, m_.target_accuracy, &f);
    }
    if (Status st = WriteResults(dir_, m_, figures_); !st.ok()) {
      std::fprintf(stderr, "trainctl bench: %s\n", st.message().c_str());
      return kExitError;
    }
    std::printf("results: %s (report.html, summary.md, results.csv, results.json)\n", dir_.c_str());
    return Upload() ? kExitOk : kExitError;
  }

 private:
  // The last step, whatever happened before: the result set (partial or not) to S3.
  bool Upload() {
    if (m_.upload.url.empty()) return true;
    const std::string name = m_.name + "/" + dir_.substr(dir_.rfind('/') + 1);
    auto n = UploadTree(m_.upload, dir_, name);
    if (!n.ok()) {
      std::fprintf(stderr,
                   "trainctl bench: upload failed (the results are still in %s; once mended, `trainctl bench "
                   "--resume %s` uploads them all again): %s\n",
                   dir_.c_str(), dir_.c_str(), n.status().message().c_str());
      return false;
    }
    std::string url = m_.upload.url;
    while (url.back() == '/') url.pop_back();
    std::printf("uploaded %d files to %s/%s/\n", *n, url.c_str(), name.c_str());
    return true;
  }

  static std::string Key(const Point& p) {
    std::string k;
    for (const auto& [a, b] : p) k += (k.empty() ? "" : ", ") + a + ": " + b;
    return k;
  }
  std::string Out(const Experiment& e) const { return dir_ + "/experiments/" + e.id + "/output"; }

  void Start(const std::string& self, size_t i, std::vector<Running>* running) {
    const Experiment& e = exps_[i];
    Figures& f = figures_[i];
    const std::string out = Out(e);
    RemoveAll(out);  // a resumed experiment starts over
    if (Status st = MakeDirs(out); !st.ok()) {
      f.state = "failed";
      f.failure = st.message();
      return;
    }
    SpawnOptions so;
    so.env = CurrentEnvironment();
    if (!m_.upload.url.empty()) {
      // The upload's credentials are bench's, not the experiments': what they print is uploaded.
      so.env.erase(std::remove_if(so.env.begin(), so.env.end(),
                                  [](const std::string& kv) {
                                    return kv.rfind("AWS_SECRET_ACCESS_KEY=", 0) == 0 ||
                                           kv.rfind("AWS_SESSION_TOKEN=", 0) == 0;
                                  }),
                   so.env.end());
    }
    const std::string config = dir_ + "/experiments/" + e.id + "/config";
    std::string log = out + (e.system == "trainctl" ? "/bench.log" : "/stdout.log");
    if (m_.target == "slurm") {
      // A batch job per experiment; sbatch --wait exits as the job does, with its exit code.
      log = out + "/sbatch.log";
      so.argv = {"sbatch", "--wait", "--parsable"};
      if (e.system == "trainctl") {
        so.argv.push_back(config + "/job.sbatch");
        so.cwd = out;  // the batch job's own output (<name>-<jobid>.out) goes with the run's
      } else {
        std::string wrapped;
        for (const auto& a : e.command) wrapped += (wrapped.empty() ? "" : " ") + slurm::ShellQuote(a);
        so.argv.insert(so.argv.end(), {"--job-name=" + e.id, "--nodes=" + std::to_string(nodes_[Key(e.point)]),
                                       "--output=" + out + "/stdout.log", "--export=ALL,TRAINCTL_BENCH_OUTPUT=" + out,
                                       "--wrap=" + wrapped});
      }
    } else if (e.system == "trainctl") {
      so.argv = {self, "run", config + "/job.json"};
    } else {
      so.argv = e.command;
      SetEnv(&so.env, "TRAINCTL_BENCH_OUTPUT", out);
    }
    so.output_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    so.new_process_group = true;
    f.started = WallSeconds();
    auto pid = Spawn(so);
    if (so.output_fd >= 0) ::close(so.output_fd);
    std::fprintf(stderr, "trainctl bench: [%zu/%zu] %s\n", i + 1, exps_.size(), e.id.c_str());
    if (!pid.ok()) {
      f.state = "failed";
      f.failure = pid.status().message();
      (void)WriteResults(dir_, m_, figures_);
      return;
    }
    f.state = "running";
    running->push_back({i, *pid, Clock::now()});
    (void)WriteResults(dir_, m_, figures_);
  }

  // SIGTERM to the experiment's process group; under Slurm, its batch job cancelled first.
  void Stop(const Running& r) {
    if (m_.target == "slurm") {
      auto lines = SplitLines(ReadTail(Out(exps_[r.index]) + "/sbatch.log", 4096));
      const std::string id = lines.empty() ? "" : lines.front().substr(0, lines.front().find(';'));
      if (!id.empty() && id.find_first_not_of("0123456789_") == std::string::npos) {
        SpawnOptions so;
        so.argv = {"scancel", id};
        so.env = CurrentEnvironment();
        (void)RunCommand(so, std::chrono::seconds(30));
      }
    }
    ::kill(-r.pid, SIGTERM);
  }

  void Finish(const Running& r, const ExitInfo& exit, bool stopping) {
    const Experiment& e = exps_[r.index];
    Figures& f = figures_[r.index];
    const std::string out = Out(e);
    f.wall_seconds = SecondsSince(r.start);
    inside_ += f.wall_seconds;
    f.exit_code = exit.signaled ? 128 + exit.signal : exit.code;
    if (e.system != "trainctl") PeerMetrics(out);
    ReadFigures(out, m_.target_accuracy, &f);
    f.state = exit.success() ? "succeeded" : stopping ? "interrupted" : "failed";
    if (f.state == "failed" && f.failure.empty()) {  // no failure record (a peer): its last line
      std::string log = out + (e.system == "trainctl" ? "/bench.log" : "/stdout.log");
      if (m_.target == "slurm" && e.system == "trainctl") log = out + "/sbatch.log";
      f.failure = exit.Describe() + Why(log);
    }
    std::fprintf(stderr, "trainctl bench: %s %s in %.1f s\n", e.id.c_str(), f.state.c_str(), f.wall_seconds);
    (void)WriteResults(dir_, m_, figures_);
  }

  Matrix m_;
  std::string dir_, base_;
  Check check_;
  std::vector<Experiment> exps_;
  std::vector<Figures> figures_;
  std::map<std::string, int> nodes_;  // by point
  Clock::time_point stop_deadline_;
  double inside_ = 0;  // seconds of the experiments this invocation ran
};

Scheduler::Scheduler(Matrix m, std::string dir, std::string base_file, Check check)
    : impl_(std::make_unique<Impl>(std::move(m), std::move(dir), std::move(base_file), std::move(check))) {}
Scheduler::~Scheduler() = default;
Status Scheduler::Prepare(const std::vector<Figures>& done) { return impl_->Prepare(done); }
int Scheduler::Run(const std::string& self) { return impl_->Run(self); }
int Scheduler::Collect() { return impl_->Collect(); }

}  // namespace trainctl::bench
