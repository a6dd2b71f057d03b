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
#include <regex>

#include "bench/argo.h"
#include "bench/matrix.h"
#include "bench/results.h"
#include "bench/scheduler.h"
#include "bench/upload.h"
#include "cli/verbs.h"
#include "common/address.h"
#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/json_field.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "job/paths.h"
#include "job/run_status.h"
#include "render/k8s/render.h"
#include "render/slurm/sbatch.h"

namespace trainctl::cli {
namespace {

std::string Timestamp() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

// target k8s: the workflow created with kubectl and waited on (its phase polled every 5 s, a
// minute of failed polls ends the wait); Ctrl-C deletes it. The result set is written on the cluster's volume by its
// exit handler.
int SubmitWorkflow(const nlohmann::json& wf, const std::string& yaml, const std::string& local) {
  const std::string name = wf["metadata"]["name"], ns = wf["metadata"]["namespace"];
  if (Status st = MakeDirs(local); !st.ok()) return Fail("bench", st);
  const std::string file = local + "/workflow.yaml";
  if (Status st = AtomicWriteFile(file, yaml); !st.ok()) return Fail("bench", st);
  auto made = Kubectl({"create", "-f", "-"}, yaml);
  if (!made.ok()) return Fail("bench", made.status());
  if (made->exit.code != 0) {
    return Fail("bench", Unavailable("cannot create the workflow (" + file +
                                     "; the cluster needs Argo Workflows): " + KubectlWhy(*made)));
  }
  std::string dir;
  for (const auto& t : wf["spec"]["templates"]) {
    if (t["name"] == "report") dir = t["container"]["command"].back();
  }
  std::printf("submitted workflow %s in namespace %s; its results go to %s on the job's volume\n", name.c_str(),
              ns.c_str(), dir.c_str());
  BlockSupervisorSignals();
  std::string phase;
  int failures = 0;  // kubectl get in a row that failed: 12 (a minute) end the wait
  while (true) {
    auto got = Kubectl({"get", "workflow", name, "-n", ns, "-o", "jsonpath={.status.phase}"});
    failures = got.ok() && got->exit.code == 0 ? 0 : failures + 1;
    if (failures >= 12) {
      return Fail("bench", Unavailable("lost the cluster while waiting for workflow " + name + ": " +
                                       (got.ok() ? KubectlWhy(*got) : got.status().message())));
    }
    if (got.ok() && got->exit.code == 0 && got->output != phase) {
      phase = got->output;
      std::printf("workflow %s: %s\n", name.c_str(), phase.empty() ? "Pending" : phase.c_str());
      std::fflush(stdout);
    }
    if (phase == "Succeeded") return kExitOk;
    if (phase == "Failed" || phase == "Error") return kExitError;
    if (int sig = WaitSignal(std::chrono::seconds(5)); IsStopSignal(sig) || StopSignal()) {
      auto deleted = Kubectl({"delete", "workflow", name, "-n", ns, "--wait=false"});
      std::fprintf(stderr, "trainctl bench: %s workflow %s\n",
                   deleted.ok() && deleted->exit.code == 0 ? "deleted" : "could not delete", name.c_str());
      return kExitInterrupted;
    }
  }
}

struct BenchFlags {
  std::string matrix, results = "bench-results", resume, target, format, output, collect;
  bool dry_run = false;
};

int RunBench(const BenchFlags& f) {
  std::vector<bench::Figures> done;
  std::string path = f.matrix, dir;
  if (!f.resume.empty()) {
    auto prior = bench::ReadResults(f.resume);
    if (!prior.ok()) return Fail("bench", prior.status());
    done = *prior;
    auto doc = nlohmann::json::parse(*ReadFile(f.resume + "/results.json"), nullptr, false);
    if (path.empty() && doc.is_object() && doc.contains("matrix") && doc["matrix"].is_string()) {
      path = doc["matrix"].get<std::string>();
    }
    dir = AbsolutePath(f.resume);
    if (path.empty()) {
      return Fail("bench", InvalidArgument(f.resume +
                                           "/results.json does not name its matrix (\"matrix\": a path); "
                                           "give it: trainctl bench MATRIX --resume " +
                                           f.resume));
    }
  }
  if (path.empty()) return Fail("bench", InvalidArgument("expected a matrix file (or --resume DIR)"));
  auto m = bench::LoadMatrix(path);
  if (!m.ok()) return Fail("bench", m.status());
  m->path = AbsolutePath(path);
  if (!f.target.empty()) m->target = f.target;
  const bool argo = f.format == "argo" || (m->target == "k8s" && f.collect.empty());
  if (!m->upload.url.empty() && !argo) {
    if (Status st = bench::CheckUpload(m->upload); !st.ok()) return Fail("bench", st);
    const std::string& ep = m->upload.endpoint;
    if (ep.rfind("http://", 0) == 0) {
      const std::string host_port =
          ep.substr(7, ep.find('/', 7) == std::string::npos ? std::string::npos : ep.find('/', 7) - 7);
      const std::string host = host_port[0] == '[' ? host_port.substr(1, host_port.find(']') - 1)
                                                   : host_port.substr(0, host_port.rfind(':'));
      if (!IsLoopbackHost(host)) {
        // The session token travels in every request's X-Amz-Security-Token header, as it is.
        const bool token = GetEnv(CurrentEnvironment(), "AWS_SESSION_TOKEN").value_or("") != "";
        std::fprintf(stderr,
                     "trainctl bench: warning: upload.endpoint %s is plain http: the results and your "
                     "access key id%s cross the network unencrypted (requests are signed; the secret key is not "
                     "sent); use https://\n",
                     ep.c_str(), token ? " and your session token (AWS_SESSION_TOKEN)" : "");
      }
    }
  }
  if (m->target == "slurm" && !argo && f.collect.empty() && !FindExecutable("sbatch", CurrentEnvironment()).ok()) {
    return Fail("bench", InvalidArgument("target slurm submits each experiment with sbatch, which is not on the PATH"));
  }
  const std::string stamp = Timestamp();
  if (!f.collect.empty()) dir = AbsolutePath(f.collect);
  if (argo) {  // a folder only to resolve the specs in; removed below
    std::string tmpl = GetEnv(CurrentEnvironment(), "TMPDIR").value_or("/tmp") + "/trainctl-bench-XXXXXX";
    if (!::mkdtemp(tmpl.data())) return Fail("bench", Internal("cannot make a temporary folder: " + tmpl));
    dir = tmpl;
  }
  if (dir.empty()) {
    dir = AbsolutePath(f.results) + "/" + m->name + "/" + stamp;
    for (int n = 2; Exists(dir); ++n)
      dir = AbsolutePath(f.results) + "/" + m->name + "/" + stamp + "-" + std::to_string(n);
  }
  if (Status st = MakeDirs(dir); !st.ok()) return Fail("bench", st);
  std::string base = m->spec_file;
  if (base.empty()) {
    base = dir + "/spec.yaml";
    if (Status st = AtomicWriteFile(base, m->inline_spec); !st.ok()) return Fail("bench", st);
  }
  if (argo) {
    auto wf = bench::ArgoWorkflow(*m, base, stamp);
    RemoveAll(dir);
    if (!wf.ok()) {
      std::fprintf(stderr, "trainctl bench: %s: %s\n", path.c_str(), wf.status().message().c_str());
      return kExitInvalidSpec;
    }
    const std::string yaml = k8s::ToYaml({*wf});
    if (f.format != "argo") return SubmitWorkflow(*wf, yaml, AbsolutePath(f.results) + "/" + m->name + "/" + stamp);
    if (f.output.empty()) {
      std::fputs(yaml.c_str(), stdout);
    } else if (Status st = AtomicWriteFile(f.output, yaml); !st.ok()) {
      return Fail("bench", st);
    }
    return kExitOk;
  }
  bench::Scheduler run(*m, dir, base, [](JobSpec* spec, const std::string& base_file, bool preflight) {
    ResolveProgramPaths(spec, ProgramBase(*spec, base_file));
    return preflight ? Preflight(*spec, base_file) : Status::Ok();
  });
  if (Status st = run.Prepare(done); !st.ok()) {
    std::fprintf(stderr, "trainctl bench: %s: %s", path.c_str(), st.message().c_str());
    if (f.resume.empty() && f.collect.empty() && !f.dry_run) RemoveAll(dir);
    return kExitInvalidSpec;
  }
  if (f.dry_run) {
    for (const auto& e : bench::Experiments(*m)) std::printf("%s\n", e.id.c_str());
    RemoveAll(dir);
    return kExitOk;
  }
  if (!f.collect.empty()) return run.Collect();
  return run.Run(SelfExe());
}

}  // namespace

void AddBench(CLI::App& app, const GlobalFlags& flags, int* code) {
  auto* cmd =
      app.add_subcommand("bench",
                         "Run an experiment matrix (configurations x repeats, and peer commands) and report it: "
                         "results.csv/json, summary.md and report.html under --results");
  static BenchFlags f;
  cmd->add_option("MATRIX", f.matrix, "the matrix file (see docs/bench.md)");
  cmd->add_option("--results", f.results, "where result sets go: RESULTS/<name>/<timestamp>/")->capture_default_str();
  auto* resume =
      cmd->add_option("--resume", f.resume, "a result set to finish: what succeeded or failed there is kept");
  cmd->add_flag("--dry-run", f.dry_run, "resolve and list the experiments, run nothing");
  cmd->add_option("--target", f.target,
                  "where experiments run, instead of the matrix's target: local, or slurm "
                  "(an sbatch per experiment, waited on; the results directory must be on "
                  "a filesystem the nodes share), or k8s (the matrix as an Argo Workflow, "
                  "submitted and waited on through kubectl)")
      ->check(CLI::IsMember({"local", "slurm", "k8s"}));
  auto* format =
      cmd->add_option("--format", f.format, "argo: print the matrix as an Argo Workflow instead of running it")
          ->check(CLI::IsMember({"argo"}))
          ->excludes(resume);
  cmd->add_option("-o,--output", f.output, "with --format: write the workflow to this file")->needs(format);
  cmd->add_option("--collect", f.collect,
                  "write the result set of experiments that ran elsewhere into this folder (the Argo "
                  "workflow's exit handler does), running nothing")
      ->excludes(resume)
      ->excludes(format);
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
  cmd->callback([compare, &flags, code] {
    if (compare->parsed()) return;
    log::SetLevel(flags.log_level);
    *code = RunBench(f);
  });
}

}  // namespace trainctl::cli
