// Launcher: places a job's agents somewhere (this machine; later Kubernetes, Slurm, MPI) and
// reports how the job ended. One implementation per subfolder.
#pragma once

#include <string>

#include "jobspec/job_spec.h"

namespace trainctl {

struct LaunchOptions {
  std::string self_exe;       // the trainctl binary, run as `trainctl agent` for each node
  bool color_output = false;  // colour worker prefixes (stdout is a terminal)
  std::string log_level = "info";
  // How agents are placed: "local", one process per node on this machine; "slurm", one srun that
  // starts an agent on each node of the Slurm allocation this runs in; or "mpi", one mpirun that
  // starts an agent on each of `mpi_hosts` (its --host list) or of the hosts in `mpi_hostfile`,
  // or nodes.max agents here when neither is given.
  std::string placement = "local";
  std::string mpi_hosts;
  std::string mpi_hostfile;
  // The address the job's store listens on and agents reach it at: loopback unless agents run on
  // other hosts.
  std::string store_host = "127.0.0.1";
  // Continue the previous run in output_dir (its checkpoints, its logs) instead of moving its
  // files aside and starting from scratch.
  bool resume = false;
  std::string verb = "run";  // the command that started it, for what the log suggests (run | torchrun)
};

class Launcher {
 public:
  virtual ~Launcher() = default;
  // Runs the job to its end; returns a trainctl exit code (common/exit_codes.h).
  virtual int Run(const JobSpec& spec, const LaunchOptions& options) = 0;
};

}  // namespace trainctl
