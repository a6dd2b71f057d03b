// `trainctl torchrun [torchrun flags] SCRIPT [ARGS...]`: torchrun's command line, mapped onto a job
// spec and run as `trainctl run` runs one (one host), or as one host's agent of a job that every
// host starts with the same command line (several hosts). docs/torchrun.md.
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "agent/start.h"
#include "cli/verbs.h"
#include "common/address.h"
#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "job/paths.h"
#include "launch/local/local_launcher.h"
#include "launch/torchrun/torchrun_launcher.h"
#include "render/k8s/render.h"

namespace trainctl::cli {

namespace {

struct TorchrunFlags {
  std::string nnodes = "1:1";
  std::string nproc_per_node = "1";
  int node_rank = -1;
  bool standalone = false;
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_id = "none";
  std::string rdzv_conf;
  int max_restarts = 0;
  double monitor_interval = 0.1;
  std::string role = "default";
  std::string log_dir;
  std::string redirects, tee, start_method = "spawn";
  std::string local_addr;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool module = false, no_python = false, run_path = false;
  bool print_spec = false;
  std::string shutdown_timeout;      // seconds: timeouts.stop_grace
  std::string signals_to_handle;     // only trainctl's stop signals
  std::string preload;               // MODULE[,MODULE...]
  std::string python;                // --python, else TRAINCTL_PYTHON, else python3 from PATH
  std::vector<std::string> program;  // SCRIPT (or MODULE) and its arguments
};

// `value` seconds (torchrun's unit for every timeout) as a spec duration; `what` names the flag
// in the error. Zero only where `zero_ok`.
Result<std::string> SecondsFlag(const std::string& what, const std::string& value, bool zero_ok) {
  char* end = nullptr;
  const double s = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || s < 0 || (s == 0 && !zero_ok)) {
    return InvalidArgument(what + ": expected a number of seconds, got " + Quote(value));
  }
  return std::to_string(static_cast<int64_t>(s * 1000)) + "ms";
}

// torchrun's --nproc-per-node: a number, or cpu, gpu, auto (GPUs when there are any, else CPUs).
Result<int> ProcsPerNode(const std::string& v) {
  int gpus = 0;
  if (DIR* d = ::opendir("/proc/driver/nvidia/gpus")) {
    while (dirent* e = ::readdir(d)) gpus += e->d_name[0] != '.' ? 1 : 0;
    ::closedir(d);
  }
  const int cpus = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  if (v == "cpu") return cpus;
  if (v == "gpu") {
    if (gpus == 0) return InvalidArgument("--nproc-per-node gpu: this machine has no NVIDIA GPU");
    return gpus;
  }
  if (v == "auto") return gpus > 0 ? gpus : cpus;
  if (v.empty() || v.size() > 6 || v.find_first_not_of("0123456789") != std::string::npos || std::stoi(v) < 1) {
    return InvalidArgument("--nproc-per-node: expected a positive number, cpu, gpu or auto, got " + Quote(v));
  }
  return std::stoi(v);
}

// A DNS-1123 label from the script's name: "train_ddp.py" -> "train-ddp".
std::string JobName(const TorchrunFlags& f) {
  std::string base = f.rdzv_id != "none" ? f.rdzv_id : std::filesystem::path(f.program[0]).stem().string();
  if (f.module) base = f.program[0].substr(f.program[0].rfind('.') + 1);
  std::string out;
  for (char c : base) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out += (std::isalnum(static_cast<unsigned char>(l)) ? l : '-');
  }
  while (!out.empty() && out.front() == '-') out.erase(out.begin());
  while (!out.empty() && out.back() == '-') out.pop_back();
  if (out.empty() || !std::isalpha(static_cast<unsigned char>(out[0]))) out = "torchrun-" + out;
  return out.substr(0, 63);
}

// The spec the command line means, as YAML text: the same parser as every spec reads it.
Result<JobSpec> ToSpec(const TorchrunFlags& f, std::string* yaml) {
  if (f.program.empty()) return InvalidArgument("give the training script (or -m MODULE) and its arguments");
  if (f.role != "default") {
    return InvalidArgument("--role " + f.role +
                           ": trainctl's tasks of a one-role job are named 'worker'; "
                           "for roles of your own, write a job spec with roles: (trainctl torchrun --print-spec "
                           "gives one to start from)");
  }
  const int modes = int(f.module) + int(f.no_python) + int(f.run_path);
  if (modes > 1) return InvalidArgument("-m, --no-python and --run-path exclude each other");
  ASSIGN_OR_RETURN(int procs, ProcsPerNode(f.nproc_per_node));
  std::string nodes = f.standalone ? "1" : f.nnodes;
  if (const size_t colon = nodes.find(':');
      colon != std::string::npos && nodes.substr(0, colon) == nodes.substr(colon + 1)) {
    nodes.resize(colon);  // "2:2" is 2
  }
  std::vector<std::string> command;
  if (f.no_python) {
    command = f.program;
  } else {
    command = {f.python.empty() ? "python3" : f.python, "-u"};
    if (f.module) command.push_back("-m");
    command.insert(command.end(), f.program.begin(), f.program.end());
  }
  nlohmann::json nodes_value = nodes;
  if (nodes.find(':') == std::string::npos) nodes_value = std::atoi(nodes.c_str());  // a plain count
  nlohmann::json spec = {{"name", JobName(f)},
                         {"nodes", nodes_value},
                         {"procs_per_node", procs},
                         {"command", command},
                         // torchrun restarts at once; a spec's restarts back off (restart.backoff)
                         {"restart", {{"max_restarts", f.max_restarts}, {"backoff", "0s"}}}};
  if (!f.log_dir.empty()) spec["output_dir"] = f.log_dir;
  if (!f.preload.empty()) {
    if (f.no_python) {
      return InvalidArgument(
          "--preload imports Python modules into a warm interpreter, but --no-python runs a "
          "program that is not Python");
    }
    spec["preload"] = Split(f.preload, ',');
  }
  // --rdzv-conf: torchrun's timeouts (seconds).
  nlohmann::json timeouts = nlohmann::json::object();
  for (const auto& kv : Split(f.rdzv_conf, ',')) {
    const size_t eq = kv.find('=');
    const std::string key = kv.substr(0, eq), value = eq == std::string::npos ? "" : kv.substr(eq + 1);
    auto seconds = [&](const char* field) -> Status {
      ASSIGN_OR_RETURN(std::string d, SecondsFlag("--rdzv-conf " + key, value, /*zero_ok=*/false));
      timeouts[field] = d;
      return Status::Ok();
    };
    if (key == "join_timeout") {
      RETURN_IF_ERROR(seconds("rendezvous"));
    } else if (key == "last_call_timeout") {
      RETURN_IF_ERROR(seconds("last_call"));
    } else if (key == "close_timeout" || key == "read_timeout" || key == "timeout") {
      RETURN_IF_ERROR(seconds("heartbeat"));
    } else if (key == "is_host") {
      if (value != "true" && value != "false" && value != "1" && value != "0") {
        return InvalidArgument("--rdzv-conf is_host: expected true or false, got " + Quote(value));
      }
    } else {
      return InvalidArgument(
          "--rdzv-conf: trainctl knows join_timeout, last_call_timeout, close_timeout, "
          "read_timeout, timeout and is_host, not " +
          Quote(key));
    }
  }
  // torch 2.x's --shutdown-timeout: the grace between SIGTERM and SIGKILL when workers are stopped.
  if (!f.shutdown_timeout.empty()) {
    ASSIGN_OR_RETURN(timeouts["stop_grace"], SecondsFlag("--shutdown-timeout", f.shutdown_timeout, /*zero_ok=*/true));
  }
  for (const auto& sig : Split(f.signals_to_handle, ',')) {
    if (!sig.empty() && sig != "SIGTERM" && sig != "SIGINT" && sig != "SIGHUP" && sig != "SIGQUIT") {
      return InvalidArgument("--signals-to-handle " + Quote(sig) +
                             ": trainctl stops the job (every worker, "
                             "SIGTERM then SIGKILL after the grace) on SIGTERM, SIGINT, SIGHUP and SIGQUIT, and "
                             "passes no other signal on");
    }
  }
  if (!timeouts.empty()) spec["timeouts"] = timeouts;
  if (f.rdzv_backend == "etcd" || f.rdzv_backend == "etcd-v2") {
    if (f.rdzv_endpoint.empty()) return InvalidArgument("--rdzv-backend " + f.rdzv_backend + " needs --rdzv-endpoint");
    spec["rendezvous"] = "etcd://" + f.rdzv_endpoint;
  }
  *yaml = k8s::ToYaml({spec});
  return ParseJobSpec(*yaml, "torchrun command line");
}

// Whether `python` (a name on PATH or a path) can import torch, without importing it: find_spec
// takes milliseconds where `import torch` takes seconds. Its resolved path in `*path`.
bool HasTorch(const std::string& python, std::string* path) {
  auto exe = FindExecutable(python, CurrentEnvironment());
  if (!exe.ok()) return false;
  *path = *exe;
  SpawnOptions o;
  o.argv = {*exe, "-c", "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 3)"};
  o.env = CurrentEnvironment();
  auto r = RunCommand(o, std::chrono::seconds(20));
  return r.ok() && r->exit.success();
}

// Whether the interpreter the workers run has torch, as torchrun's (the Python that runs it)
// always does: --python (or TRAINCTL_PYTHON) as given, else python3 from PATH. If not, an error
// that names the interpreter tried and one on this machine that has torch, before any worker
// spends a restart on a ModuleNotFoundError.
Status CheckPython(const TorchrunFlags& f) {
  if (f.no_python) return Status::Ok();
  const char* env = std::getenv("TRAINCTL_PYTHON");
  const std::string given = f.python;  // --python, else TRAINCTL_PYTHON (put there by Torchrun)
  const std::string how = env && given == env ? "TRAINCTL_PYTHON=" : "--python ";
  std::string tried;
  if (!given.empty()) {
    if (!HasTorch(given, &tried)) {
      return InvalidArgument(how + given + ": " +
                             (tried.empty() ? "no such interpreter" : tried + " cannot import torch"));
    }
    return Status::Ok();
  }
  if (HasTorch("python3", &tried)) return Status::Ok();
  if (tried.empty()) return Status::Ok();  // no python3 at all: the preflight names it
  std::vector<std::string> seen = {std::filesystem::weakly_canonical(tried).string()};
  std::string other;
  std::vector<std::string> candidates;
  for (const auto& dir : Split(std::getenv("PATH") ? std::getenv("PATH") : "", ':')) {
    for (const char* name : {"python3", "python"}) candidates.push_back(dir + "/" + name);
  }
  for (const char* p : {"/usr/bin/python3", "/usr/local/bin/python3", "/opt/conda/bin/python3"})
    candidates.push_back(p);
  for (const auto& c : candidates) {
    std::error_code ec;
    if (!std::filesystem::exists(c, ec)) continue;
    const std::string real = std::filesystem::weakly_canonical(c, ec).string();
    if (std::find(seen.begin(), seen.end(), real) != seen.end()) continue;
    seen.push_back(real);
    std::string at;
    if (HasTorch(c, &at)) {
      other = c;
      break;
    }
  }
  std::string message = "python3 from PATH (" + tried +
                        ") cannot import torch, so every worker would fail with "
                        "ModuleNotFoundError; ";
  if (!other.empty()) {
    message += other + " has torch: run with --python " + other + " (or TRAINCTL_PYTHON=" + other +
               "), put it first on PATH, or install torch for " + tried;
  } else {
    message += "no interpreter on PATH has it: install torch (pip install torch) for " + tried +
               ", or name one that has it with --python or TRAINCTL_PYTHON";
  }
  return InvalidArgument(message);
}

// --rdzv-conf is_host=true|false (torchrun's): whether this host serves the store; unset: inferred.
std::optional<bool> IsHostConf(const std::string& rdzv_conf) {
  for (const auto& kv : Split(rdzv_conf, ',')) {
    if (kv == "is_host=true" || kv == "is_host=1") return true;
    if (kv == "is_host=false" || kv == "is_host=0") return false;
  }
  return std::nullopt;
}

// Whether this machine can listen on `port` (so it is the host of a c10d rendezvous endpoint).
bool PortFree(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

int Torchrun(TorchrunFlags f, const GlobalFlags& flags) {
  log::SetLevel(flags.log_level);
  auto bad = [](const std::string& message) {
    std::fprintf(stderr, "trainctl torchrun: %s\n", message.c_str());
    return kExitInvalidSpec;
  };
  if (f.rdzv_backend != "static" && f.rdzv_backend != "c10d" && f.rdzv_backend != "etcd" &&
      f.rdzv_backend != "etcd-v2") {
    return bad("--rdzv-backend: expected c10d, static, etcd or etcd-v2, got " + Quote(f.rdzv_backend));
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, const std::string&>{"--redirects", f.redirects}, {"--tee", f.tee}}) {
    // trainctl always keeps every rank's output in its log file and shows it prefixed: what
    // --redirects/--tee 3 (both streams) ask for. Other values would ask for less.
    if (!value.empty() && value != "3" && value.find_first_not_of("0123456789:,") != std::string::npos) {
      return bad(std::string(flag) + ": expected torchrun's 0-3 or a per-rank map, got " + Quote(value));
    }
  }
  if (f.start_method != "spawn" && f.start_method != "fork" && f.start_method != "forkserver") {
    return bad("--start-method: expected spawn, fork or forkserver, got " + Quote(f.start_method));
  }
  if (const char* env = std::getenv("TRAINCTL_PYTHON"); f.python.empty() && env && *env && !f.no_python) {
    f.python = env;
  }
  std::string yaml;
  auto spec = ToSpec(f, &yaml);
  if (!spec.ok()) return bad(spec.status().message());
  if (f.print_spec) {
    std::fputs(yaml.c_str(), stdout);
    return kExitOk;
  }
  // The command line is sound; now whether its interpreter can run a PyTorch program.
  if (Status st = CheckPython(f); !st.ok()) return bad(st.message());
  if (f.log_dir.empty()) {
    // As torchrun keeps its logs out of the working directory: in trainctl's state directory,
    // where ps, logs and status find them.
    spec->output_dir = std::filesystem::path(runs::IndexDir()).parent_path() / "torchrun" / spec->name;
    spec->checkpoint_dir = spec->output_dir + "/checkpoints";
  }
  spec->output_dir = AbsolutePath(spec->output_dir);
  spec->checkpoint_dir = AbsolutePath(spec->checkpoint_dir);
  ResolveProgramPaths(&*spec, AbsolutePath("."));
  if (Status st = Preflight(*spec, "torchrun command line"); !st.ok()) return bad(st.message());
  BlockSupervisorSignals();
  if (spec->nodes.max == 1 || f.standalone) {  // one host: as `trainctl run` does
    LaunchOptions o;
    o.self_exe = SelfExe();
    o.color_output = ::isatty(STDOUT_FILENO) != 0;
    o.log_level = flags.log_level;
    o.verb = "torchrun";
    LocalLauncher launcher;
    return launcher.Run(*spec, o);
  }
  if (f.rdzv_id == "none") return bad("a job of several hosts needs --rdzv-id, the same on every host");
  AgentProcessOptions a;
  a.run_id = spec->name + "-" + f.rdzv_id;
  LaunchOptions o;
  o.color_output = ::isatty(STDOUT_FILENO) != 0;
  auto run_here = [&] { return TorchrunHostLauncher(a).Run(*spec, o); };
  if (!spec->rendezvous.empty()) {  // etcd: every host's agent meets there, ranks by arrival
    a.host = !f.local_addr.empty() ? f.local_addr : "auto";
    a.store_addr = spec->rendezvous;
    LOG_INFO("joining job {} on {}", spec->name, spec->rendezvous);
    return run_here();
  }
  // Several hosts, each running this same command line: the endpoint's host serves the job's store.
  std::string endpoint = f.rdzv_endpoint;
  if (f.rdzv_backend == "static" && endpoint.empty()) endpoint = f.master_addr + ":" + std::to_string(f.master_port);
  std::string host;
  uint16_t port = 0;
  if (endpoint.find(':') == std::string::npos) endpoint += ":29400";  // torchrun's default c10d port
  if (Status st = ParseHostPort(endpoint, &host, &port); !st.ok()) return bad("--rdzv-endpoint: " + st.message());
  if (f.rdzv_backend == "static" && f.node_rank < 0)
    return bad("--rdzv-backend static needs --node-rank on every host");
  const char* token = std::getenv("TRAINCTL_TOKEN");
  if (!token || std::string(token).size() < 16) {
    return bad(
        "a job of several hosts needs its token in TRAINCTL_TOKEN, the same on every host and at least "
        "16 characters (for example: export TRAINCTL_TOKEN=$(openssl rand -hex 32)); the store at " +
        endpoint + " refuses clients without it");
  }
  // A loopback endpoint (127.x, ::1, localhost) keeps the whole job on loopback.
  a.host = !f.local_addr.empty() ? f.local_addr : IsLoopbackHost(host) ? "127.0.0.1" : "auto";
  // As torchrun's c10d backend: the endpoint's host serves the store (is_host says so, or the
  // endpoint names this machine and its port is free here); the others join it. Two commands on
  // the endpoint's host: the first serves, the second finds the port taken and joins.
  const std::optional<bool> is_host = IsHostConf(f.rdzv_conf);
  const bool serve = f.rdzv_backend == "static" ? f.node_rank == 0
                     : is_host                  ? *is_host
                                                : IsThisMachine(host) && PortFree(port);
  a.serve_store = serve;
  a.join_if_served = f.rdzv_backend != "static" && !is_host;
  a.node_rank = f.rdzv_backend == "static" ? f.node_rank : (serve ? 0 : -1);
  a.store_addr = "tcp://" + endpoint;
  a.store_token = token;
  ::unsetenv("TRAINCTL_TOKEN");  // not into the workers' environment
  // The node that serves says so once the store is up (or that it joins, if another command here
  // took the port first).
  if (!serve) {
    LOG_INFO("node {} of job {}: joining the job's store at {}",
             a.node_rank < 0 ? std::string("by arrival") : std::to_string(a.node_rank), spec->name, endpoint);
  }
  return run_here();
}

// `trainctl torchrun --help`'s first line shows what follows the flags: the script and its arguments.
class TorchrunUsage : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App* app, std::string name) const override {
    std::string usage = CLI::Formatter::make_usage(app, std::move(name));
    const size_t end = usage.find_last_not_of('\n') + 1;
    return usage.substr(0, end) + " SCRIPT [ARGS...]" + usage.substr(end);
  }
};

// Flags of torchrun's that trainctl does not take, and what to do instead.
std::string NotTaken(const std::string& flag) {
  std::string f = flag.substr(0, flag.find('='));
  std::replace(f.begin(), f.end(), '_', '-');
  if (f == "--local-ranks-filter") {
    return "every rank's output is shown, prefixed with its rank; trainctl logs JOB --rank N shows one rank's";
  }
  if (f == "--logs-specs") return "every rank's output goes to <--log-dir>/logs/";
  if (f == "--duplicate-stdout-filters" || f == "--duplicate-stderr-filters") {
    return "every rank's whole output is in <--log-dir>/logs/worker-RANK.log: grep it there";
  }
  if (f == "--log-line-prefix-template") return "every rank's lines are shown prefixed with [worker-RANK]";
  if (f == "--event-log-handler") {
    return "a job's events are in <--log-dir>/status.json, metrics.jsonl and the agents' log, for no handler to take";
  }
  if (f == "--numa-binding") {
    return "a job spec's cpu_bind: cores gives each worker cores of its own (--print-spec writes the spec)";
  }
  if (f == "--virtual-local-rank") {
    return "LOCAL_RANK is each worker's index on its host and every worker sees the host's GPUs, as torchrun's default";
  }
  if (f == "--print-completion") return "trainctl has no shell completion script";
  return "";
}

}  // namespace

void AddTorchrun(CLI::App& app, const GlobalFlags& flags, int* code) {
  static TorchrunFlags f;
  auto* cmd =
      app.add_subcommand("torchrun",
                         "torchrun's command line: run a PyTorch script (or -m MODULE, or --no-python PROGRAM) on "
                         "this host or, with the same command on every host, on several; flags in both spellings "
                         "(--nproc-per-node, --nproc_per_node). --print-spec shows the job spec it means");
  cmd->prefix_command();  // everything after the script is the script's (and not the app's:)
  cmd->fallthrough(false);
  cmd->add_option("--nnodes", f.nnodes, "N or MIN:MAX hosts")->capture_default_str();
  cmd->add_option("--nproc-per-node,--nproc_per_node", f.nproc_per_node, "workers per host: N, cpu, gpu or auto")
      ->capture_default_str();
  cmd->add_option("--node-rank,--node_rank", f.node_rank, "this host's rank (static rendezvous)");
  cmd->add_flag("--standalone", f.standalone, "one host, a store of its own on a free port");
  cmd->add_option("--rdzv-backend,--rdzv_backend", f.rdzv_backend, "c10d, static, etcd or etcd-v2")
      ->capture_default_str();
  cmd->add_option("--rdzv-endpoint,--rdzv_endpoint", f.rdzv_endpoint,
                  "HOST:PORT of the rendezvous (its host serves the store)");
  cmd->add_option("--rdzv-id,--rdzv_id", f.rdzv_id, "the job's id, the same on every host")->capture_default_str();
  cmd->add_option("--rdzv-conf,--rdzv_conf", f.rdzv_conf,
                  "join_timeout=S,last_call_timeout=S,close_timeout=S,read_timeout=S,is_host=BOOL");
  cmd->add_option("--max-restarts,--max_restarts", f.max_restarts, "worker-group restarts before the job fails")
      ->capture_default_str();
  cmd->add_option("--monitor-interval,--monitor_interval", f.monitor_interval,
                  "accepted: trainctl's agents watch their workers continuously");
  cmd->add_option("--role", f.role, "the workers' role (only torchrun's default)")->capture_default_str();
  cmd->add_option("--log-dir,--log_dir", f.log_dir, "the run's directory (its logs/ hold every rank's output)");
  cmd->add_option("-r,--redirects", f.redirects, "accepted: every rank's output always goes to its log file");
  cmd->add_option("-t,--tee", f.tee, "accepted: every rank's output always goes to its log file and here");
  cmd->add_option("--local-addr,--local_addr", f.local_addr, "this host's address for its peers");
  cmd->add_option("--master-addr,--master_addr", f.master_addr, "static rendezvous: the host of node 0")
      ->capture_default_str();
  cmd->add_option("--master-port,--master_port", f.master_port, "static rendezvous: node 0's port")
      ->capture_default_str();
  cmd->add_option("--start-method,--start_method", f.start_method, "accepted: workers are always new processes")
      ->capture_default_str();
  cmd->add_option("--shutdown-timeout,--shutdown_timeout", f.shutdown_timeout,
                  "seconds between SIGTERM and SIGKILL when the workers are stopped (timeouts.stop_grace)");
  cmd->add_option("--signals-to-handle,--signals_to_handle", f.signals_to_handle,
                  "accepted for SIGTERM, SIGINT, SIGHUP, SIGQUIT: each stops the job");
  cmd->add_flag("-m,--module", f.module, "run SCRIPT as a Python module (python -m)");
  cmd->add_flag("--no-python,--no_python", f.no_python, "run SCRIPT as a program, not through python3");
  cmd->add_option("--python", f.python,
                  "the interpreter the workers run (default: TRAINCTL_PYTHON, else python3 from PATH; either must "
                  "import torch, as torchrun's own Python does)");
  cmd->add_flag("--run-path,--run_path", f.run_path, "run SCRIPT as a Python file (the default)");
  cmd->add_option("--preload", f.preload,
                  "MODULE[,MODULE...]: import these once per host in a warm interpreter and fork each worker "
                  "from it (restarts too), instead of each importing them (see docs/own-program.md)");
  cmd->add_flag("--print-spec", f.print_spec, "print the job spec this command line means, as YAML, and exit");
  cmd->formatter(std::make_shared<TorchrunUsage>());
  cmd->footer(
      std::string("SCRIPT [ARGS...]: the training script (a Python file; with -m a module, with --no-python a "
                  "program) and its arguments, which it gets unchanged. Every torchrun flag comes before it.\n\n") +
      kExitCodesHelp + "\n\nDocs: docs/torchrun.md");
  cmd->callback([&flags, cmd, code] {
    f.program = cmd->remaining();  // SCRIPT and everything after it
    if (!f.program.empty() && f.program[0] == "--") f.program.erase(f.program.begin());
    if (!f.program.empty() && f.program[0].size() > 1 && f.program[0][0] == '-') {
      // A flag before the script that is none of torchrun's: a typo, not the script's name.
      const std::string& flag = f.program[0];
      const std::string instead = NotTaken(flag), near = NearestFlag(*cmd, flag);
      std::fprintf(stderr, "trainctl torchrun: %s %s%s\nRun 'trainctl torchrun --help' for its flags.\n",
                   instead.empty() ? "unknown flag" : "trainctl does not take", Quote(flag).c_str(),
                   !instead.empty() ? (": " + instead).c_str()
                   : near.empty()   ? "; the script (and its arguments) come after the flags"
                                    : ("; did you mean " + near + "?").c_str());
      *code = kExitInvalidSpec;
      return;
    }
    *code = Torchrun(f, flags);
  });
}

}  // namespace trainctl::cli
