#include <unistd.h>

#include "cli/verbs.h"
#include "common/address.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "launch/local/local_launcher.h"

namespace trainctl::cli {

namespace {

// The most tasks (agents' workers) trainctl starts on this one machine.
int LocalTaskLimit() {
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  return static_cast<int>(std::max<long>(1024, 64 * std::max(1L, cpus)));
}

// Whether every host of --hosts is this machine (localhost,localhost: two nodes here), whose
// agents reach a store on loopback.
bool AllHostsHere(const LaunchOptions& o) {
  if (o.mpi_hosts.empty() || !o.mpi_hostfile.empty()) return false;
  for (const auto& h : Split(o.mpi_hosts, ',')) {
    const std::string host = h.substr(0, h.find(':'));
    if (!IsLoopbackHost(host) && !IsThisMachine(host)) return false;
  }
  return true;
}

}  // namespace

void AddRun(CLI::App& app, const GlobalFlags& flags, int* code) {
  auto* cmd = app.add_subcommand("run",
                                 "Run a job from this machine: one agent per node, each starting its workers, here "
                                 "or under mpirun on the hosts given; worker output is shown as [worker-N] lines and "
                                 "saved under <output_dir>/logs");
  static SpecFlags spec_storage;
  SpecFlags* spec_flags = &spec_storage;
  spec_flags->Add(cmd);
  static LaunchOptions launch_storage;
  LaunchOptions* lo = &launch_storage;
  cmd->add_option("--target", lo->placement,
                  "local: the agents run here; mpi: one agent per host under mpirun (Open MPI); "
                  "slurm: one agent per node of the Slurm allocation this runs in, under srun "
                  "(the script that `trainctl render --target slurm` writes does this)")
      ->capture_default_str()
      ->check(CLI::IsMember({"local", "mpi", "slurm"}));
  cmd->add_option("--hosts", lo->mpi_hosts, "mpi: the hosts, as mpirun's --host (a,b or a:1,b:1)");
  cmd->add_option("--hostfile", lo->mpi_hostfile, "mpi: a hostfile, as mpirun's --hostfile")->check(CLI::ExistingFile);
  cmd->add_option("--store-host", lo->store_host,
                  "mpi, slurm: the address of this machine that agents reach the job's store at (it "
                  "listens there, with the job's token); a local job's store is a Unix socket for "
                  "this user's processes unless this names another address than loopback")
      ->capture_default_str();
  static int max_tasks = 0;
  cmd->add_option("--max-tasks", max_tasks,
                  "the most tasks this run may start on this machine (default: 64 per CPU, at least 1024); a "
                  "wider job is refused before anything starts")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--resume", lo->resume,
                "continue the previous run in output_dir from its newest checkpoint (trainer.resume); "
                "without it, that run's files move to output_dir/previous/<run id>/ and this run "
                "starts from scratch");
  cmd->callback([spec_flags, lo, &flags, code] {
    log::SetLevel(flags.log_level);
    auto spec = LoadOrReport(*spec_flags);
    if (!spec) {
      *code = kExitInvalidSpec;
      return;
    }
    const bool slurm = lo->placement == "slurm";
    const bool remote = !lo->mpi_hosts.empty() || !lo->mpi_hostfile.empty() || slurm;
    std::string bad_flags;
    if (lo->placement == "local" && remote) {
      bad_flags = "--hosts and --hostfile go with --target mpi";
    } else if (slurm && GetEnv(CurrentEnvironment(), "SLURM_JOB_ID").value_or("").empty()) {
      bad_flags =
          "--target slurm runs inside a Slurm allocation (sbatch or salloc); to submit a "
          "job, write its batch script with trainctl render --target slurm";
    } else if (remote && spec->rendezvous.empty() && IsLoopbackHost(lo->store_host) && !AllHostsHere(*lo)) {
      bad_flags = "agents on other hosts cannot reach a store on " + lo->store_host +
                  "; give --store-host with this machine's address on their network (or a "
                  "rendezvous: etcd://... in the spec)";
    } else if (const int limit = max_tasks > 0 ? max_tasks : LocalTaskLimit(); !remote && spec->world_size() > limit) {
      bad_flags = DescribeTasks(*spec, false) + " is " + std::to_string(spec->world_size()) +
                  " tasks on this machine, more than trainctl starts on one (" + std::to_string(limit) +
                  (max_tasks > 0 ? ": --max-tasks" : ": 64 per CPU, at least 1024; --max-tasks N allows more") +
                  "); spread the job over hosts (--target mpi --hosts, or slurm) or make it smaller";
    } else if (lo->placement == "mpi" && !FindExecutable("mpirun", CurrentEnvironment()).ok()) {
      bad_flags = "--target mpi needs mpirun on the PATH (Open MPI; on Debian: apt-get install openmpi-bin)";
    }
    if (!bad_flags.empty()) {
      std::fprintf(stderr, "trainctl run: %s\n", bad_flags.c_str());
      *code = kExitInvalidSpec;
      return;
    }
    spec->output_dir = AbsolutePath(spec->output_dir);
    spec->checkpoint_dir = AbsolutePath(spec->checkpoint_dir);
    ResolveProgramPaths(&*spec, ProgramBase(*spec, spec_flags->Sources().files[0]));
    spec->working_dir = AbsolutePath(spec->working_dir);
    if (auto shape = ResolveFolderShape(&*spec); !shape.ok()) {
      std::fprintf(stderr, "%s: trainer.data: %s\n", spec_flags->Sources().files[0].c_str(),
                   shape.status().message().c_str());
      *code = kExitInvalidSpec;
      return;
    } else if (!shape->empty()) {
      LOG_INFO("{}", *shape);
    }
    // A program that cannot start is a spec error, found now rather than as N worker crashes.
    if (Status st = Preflight(*spec, spec_flags->Sources().files[0], spec_flags->sets); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.message().c_str());
      *code = kExitInvalidSpec;
      return;
    }
    BlockSupervisorSignals();
    LaunchOptions options = *lo;
    options.resume = lo->resume || spec->trainer.resume;
    if (spec->trainer.enabled) spec->trainer.resume = options.resume;  // job.json says so
    options.self_exe = SelfExe();
    options.color_output = ::isatty(STDOUT_FILENO) != 0;
    options.log_level = flags.log_level;
    LocalLauncher launcher;
    *code = launcher.Run(*spec, options);
  });
}

}  // namespace trainctl::cli
