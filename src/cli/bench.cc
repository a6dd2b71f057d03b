// `trainctl bench MATRIX`: every experiment of a matrix run on this machine (K at once), its
// figures gathered from its own records, the result set written after each experiment (so a
// crash or Ctrl-C leaves what was done), every process stopped on the way out. `trainctl bench
// compare A B`: two result sets side by side, regressions flagged.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <map>

#include <nlohmann/json.hpp>

#include "bench/matrix.h"
#include "bench/results.h"
#include "bench/upload.h"
#include "cli/verbs.h"
#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "job/paths.h"
#include "launch/slurm/sbatch.h"

namespace trainctl::cli {
namespace {

using bench::Experiment;
using bench::Figures;

struct Running {
  size_t index;  // into the experiments
  pid_t pid;
  Clock::time_point start;
};

std::string Timestamp() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

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

class BenchRun {
 public:
  BenchRun(bench::Matrix m, std::string dir, std::string base_file)
      : m_(std::move(m)), dir_(std::move(dir)), base_(std::move(base_file)) {}

  // Resolves every experiment's spec before anything runs: a bad point stops the bench at once.
  Status Prepare(const std::vector<Figures>& done) {
    exps_ = bench::Experiments(m_);
    std::map<std::string, Figures> kept;
    for (const auto& f : done) {
      if (f.state == "succeeded" || f.state == "failed") kept[f.id] = f;
    }
    std::string errors;
    std::map<std::string, int> workers;  // by point
    for (const auto& e : exps_) {
      Figures f;
      f.id = e.id;
      f.system = e.system;
      f.point = e.point;
      f.repeat = e.repeat;
      const std::string out = Out(e), key = Key(e.point);
      if (!workers.count(key)) {
        auto spec = bench::ExperimentSpec(m_, base_, e.point, out);
        std::string where = "point {" + key + "}";
        if (!spec.ok()) {
          errors += where + ":\n" + spec.status().message() + "\n";
          workers[key] = 0;
          continue;
        }
        if (Status st = Preflight(*spec, base_); !st.ok()) errors += where + ":\n" + st.message() + "\n";
        workers[key] = spec->world_size();
        nodes_[key] = spec->nodes.max;
        specs_[key] = JobSpecToJson(*spec, 2) + "\n";
      }
      f.workers = workers[key];
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
        auto resolved = bench::ExperimentSpec(m_, base_, e.point, Out(e));
        if (!resolved.ok()) return resolved.status();
        RETURN_IF_ERROR(AtomicWriteFile(config + "/job.json", JobSpecToJson(*resolved, 2) + "\n"));
        if (m_.target == "slurm") {
          RETURN_IF_ERROR(AtomicWriteFile(config + "/job.sbatch",
                                          slurm::SbatchScript(*resolved, {config + "/job.json"}, SelfExe()), 0755));
        }
      } else {
        RETURN_IF_ERROR(AtomicWriteFile(config + "/command.json", nlohmann::json(e.command).dump() + "\n"));
      }
    }
    return bench::WriteResults(dir_, m_, figures_);
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
      if ((sig && sig != SIGCHLD) || StopSignal()) {
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
    (void)bench::WriteResults(dir_, m_, figures_);
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
    // The last step, whatever happened before: the result set (partial or not) to S3.
    bool uploaded = true;
    if (!m_.upload.url.empty()) {
      const std::string name = m_.name + "/" + dir_.substr(dir_.rfind('/') + 1);
      auto n = bench::UploadTree(m_.upload, dir_, name);
      if (n.ok()) {
        std::string url = m_.upload.url;
        while (url.back() == '/') url.pop_back();
        std::printf("uploaded %d files to %s/%s/\n", *n, url.c_str(), name.c_str());
      } else {
        uploaded = false;
        std::fprintf(stderr, "trainctl bench: upload failed (the results are still in %s): %s\n", dir_.c_str(),
                     n.status().message().c_str());
      }
    }
    if (stopping || StopSignal()) return kExitInterrupted;
    return failed || !uploaded ? kExitError : kExitOk;
  }

 private:
  static std::string Key(const bench::Point& p) {
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
                                       "--output=" + out + "/stdout.log",
                                       "--export=ALL,TRAINCTL_BENCH_OUTPUT=" + out, "--wrap=" + wrapped});
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
      (void)bench::WriteResults(dir_, m_, figures_);
      return;
    }
    f.state = "running";
    running->push_back({i, *pid, Clock::now()});
    (void)bench::WriteResults(dir_, m_, figures_);
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
    bench::ReadFigures(out, m_.target_accuracy, &f);
    f.state = exit.success() ? "succeeded" : stopping ? "interrupted" : "failed";
    if (f.state == "failed" && f.failure.empty()) {  // no failure record (a peer): its last line
      std::string log = out + (e.system == "trainctl" ? "/bench.log" : "/stdout.log");
      if (m_.target == "slurm" && e.system == "trainctl") log = out + "/sbatch.log";
      auto lines = SplitLines(ReadTail(log, 2000));
      f.failure = exit.Describe() + (lines.empty() ? "" : ": " + lines.back());
    }
    std::fprintf(stderr, "trainctl bench: %s %s in %.1f s\n", e.id.c_str(), f.state.c_str(), f.wall_seconds);
    (void)bench::WriteResults(dir_, m_, figures_);
  }

  bench::Matrix m_;
  std::string dir_, base_;
  std::vector<Experiment> exps_;
  std::vector<Figures> figures_;
  std::map<std::string, std::string> specs_;
  std::map<std::string, int> nodes_;  // by point
  Clock::time_point stop_deadline_;
  double inside_ = 0;  // seconds of the experiments this invocation ran
};

int RunBench(const std::string& matrix_path, const std::string& results, const std::string& resume,
             const std::string& target, bool dry_run) {
  std::vector<Figures> done;
  std::string path = matrix_path, dir;
  if (!resume.empty()) {
    auto prior = bench::ReadResults(resume);
    if (!prior.ok()) return Fail("bench", prior.status());
    done = *prior;
    auto doc = nlohmann::json::parse(*ReadFile(resume + "/results.json"), nullptr, false);
    if (path.empty()) path = doc.value("matrix", "");
    dir = AbsolutePath(resume);
  }
  if (path.empty()) return Fail("bench", InvalidArgument("expected a matrix file (or --resume DIR)"));
  auto m = bench::LoadMatrix(path);
  if (!m.ok()) return Fail("bench", m.status());
  m->path = AbsolutePath(path);
  if (!target.empty()) m->target = target;
  if (!m->upload.url.empty()) {
    if (Status st = bench::CheckUpload(m->upload); !st.ok()) return Fail("bench", st);
  }
  if (m->target == "slurm" && !FindExecutable("sbatch", CurrentEnvironment()).ok()) {
    return Fail("bench", InvalidArgument("target slurm submits each experiment with sbatch, which is not on the PATH"));
  }
  if (dir.empty()) {
    dir = AbsolutePath(results) + "/" + m->name + "/" + Timestamp();
    for (int n = 2; Exists(dir); ++n) dir = AbsolutePath(results) + "/" + m->name + "/" + Timestamp() + "-" + std::to_string(n);
  }
  if (Status st = MakeDirs(dir); !st.ok()) return Fail("bench", st);
  std::string base = m->spec_file;
  if (base.empty()) {
    base = dir + "/spec.yaml";
    if (Status st = AtomicWriteFile(base, m->inline_spec); !st.ok()) return Fail("bench", st);
  }
  BenchRun run(*m, dir, base);
  if (Status st = run.Prepare(done); !st.ok()) {
    std::fprintf(stderr, "trainctl bench: %s: %s", path.c_str(), st.message().c_str());
    if (resume.empty() && !dry_run) RemoveAll(dir);
    return kExitInvalidSpec;
  }
  if (dry_run) {
    for (const auto& e : bench::Experiments(*m)) std::printf("%s\n", e.id.c_str());
    RemoveAll(dir);
    return kExitOk;
  }
  return run.Run(SelfExe());
}

}  // namespace

void AddBench(CLI::App& app, const GlobalFlags& flags, int* code) {
  auto* cmd = app.add_subcommand(
      "bench", "Run an experiment matrix (configurations x repeats, and peer commands) and report it: "
               "results.csv/json, summary.md and report.html under --results");
  static std::string matrix, results = "bench-results", resume;
  static bool dry_run = false;
  cmd->add_option("MATRIX", matrix, "the matrix file (see docs/bench.md)");
  cmd->add_option("--results", results, "where result sets go: RESULTS/<name>/<timestamp>/")->capture_default_str();
  cmd->add_option("--resume", resume, "a result set to finish: what succeeded or failed there is kept");
  cmd->add_flag("--dry-run", dry_run, "resolve and list the experiments, run nothing");
  static std::string target;
  cmd->add_option("--target", target, "where experiments run, instead of the matrix's target: local, or slurm "
                                      "(an sbatch per experiment, waited on; the results directory must be on "
                                      "a filesystem the nodes share)")
      ->check(CLI::IsMember({"local", "slurm"}));
  auto* compare = cmd->add_subcommand("compare", "B against A, point by point; exit 1 on a regression");
  static std::string a, b;
  static double threshold = 5;
  compare->add_option("A", a, "the earlier result set (a folder with results.json)")->required();
  compare->add_option("B", b, "the later one")->required();
  compare->add_option("--threshold", threshold, "percent: throughput down or epoch time up by more is a regression")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1000.0));
  compare->callback([&flags, code] {
    log::SetLevel(flags.log_level);
    auto ra = bench::ReadResults(a), rb = bench::ReadResults(b);
    if (!ra.ok() || !rb.ok()) {
      *code = Fail("bench compare", !ra.ok() ? ra.status() : rb.status());
      return;
    }
    int regressions = 0;
    std::printf("%s", bench::Compare(*ra, *rb, threshold / 100, &regressions).c_str());
    std::printf("%d regression(s) past %.1f %%\n", regressions, threshold);
    *code = regressions ? kExitError : kExitOk;
  });
  cmd->callback([cmd, compare, &flags, code] {
    if (compare->parsed()) return;
    log::SetLevel(flags.log_level);
    *code = RunBench(matrix, results, resume, target, dry_run);
  });
}

}  // namespace trainctl::cli
