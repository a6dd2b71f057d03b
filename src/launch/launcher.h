// Launcher: places a job's agents somewhere (this machine; later Kubernetes, Slurm, MPI) and
// reports how the job ended. One implementation per subfolder.
#pragma once

#include <string>

#include "spec/job_spec.h"

namespace trainctl {

struct LaunchOptions {
  std::string self_exe;        // the trainctl binary, run as `trainctl agent` for each node
  bool color_output = false;   // colour worker prefixes (stdout is a terminal)
  std::string log_level = "info";
};

class Launcher {
 public:
  virtual ~Launcher() = default;
  // Runs the job to its end; returns a trainctl exit code (common/exit_codes.h).
  virtual int Run(const JobSpec& spec, const LaunchOptions& options) = 0;
};

}  // namespace trainctl
