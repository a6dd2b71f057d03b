#include "render/slurm/sbatch.h"

#include <cmath>

namespace trainctl::slurm {

std::string ShellQuote(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                              "0123456789_-./=:,@+%") == std::string::npos) {
    return word;
  }
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string SbatchScript(const JobSpec& spec, const std::vector<std::string>& run_args, const std::string& trainctl) {
  const ResourcesSpec r = NodeResources(spec);  // one agent per node runs all its tasks
  std::string s = "#!/bin/bash\n";
  s += "# trainctl job " + spec.name + ": submit with `sbatch " + spec.name +
       ".sbatch` (sbatch's own\n"
       "# flags, such as -p PARTITION or -A ACCOUNT, add to or override these lines).\n";
  s += "#SBATCH --job-name=" + spec.name + "\n";
  s += "#SBATCH --nodes=" + std::to_string(spec.nodes.max) + "\n";
  s += "#SBATCH --ntasks-per-node=1\n";
  if (r.cpus > 0) s += "#SBATCH --cpus-per-task=" + std::to_string(int(std::ceil(r.cpus - 1e-9))) + "\n";
  if (r.memory_bytes > 0) s += "#SBATCH --mem=" + std::to_string((r.memory_bytes + (1 << 20) - 1) >> 20) + "M\n";
  if (r.gpus > 0) s += "#SBATCH --gpus-per-node=" + std::to_string(r.gpus) + "\n";
  if (spec.timeouts.job.count() > 0) {
    // Slurm's limit leaves trainctl's own deadline room to stop the job and write its report.
    const auto seconds = (spec.timeouts.job + spec.timeouts.stop_grace).count() / 1000 + 60;
    s += "#SBATCH --time=" + std::to_string((seconds + 59) / 60) + "\n";
  }
  s += "#SBATCH --output=" + spec.name + "-%j.out\n";
  s += "set -euo pipefail\n";
  s += "# The agents, one per node under srun, reach the job's store on this node by its host name.\n";
  s += "exec " + ShellQuote(trainctl) + " run";
  for (const auto& a : run_args) s += " " + ShellQuote(a);
  // Requeued by Slurm (preemption, a node failure): continue the run rather than start over.
  s += " --target slurm --store-host \"$(hostname)\" ${SLURM_RESTART_COUNT:+--resume}\n";
  return s;
}

}  // namespace trainctl::slurm
