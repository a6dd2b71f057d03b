// The Slurm batch script for a job spec: `trainctl render --target slurm`. The script asks for
// nodes.max nodes, one task each, with what its busiest node needs (procs_per_node times the
// per-worker resources; with roles, the tasks of every role that trainctl places there), and runs
// `trainctl run --target slurm` on the first node: that serves the job's store there and starts
// one agent per node with srun.
#pragma once

#include <string>
#include <vector>

#include "jobspec/job_spec.h"

namespace trainctl::slurm {

// `run_args`: the spec sources as `trainctl run` takes them (absolute paths, -f, --set);
// `trainctl`: the binary as the nodes see it.
std::string SbatchScript(const JobSpec& spec, const std::vector<std::string>& run_args, const std::string& trainctl);

// Quotes a word for sh: unchanged if it is plainly safe, else in single quotes.
std::string ShellQuote(const std::string& word);

}  // namespace trainctl::slurm
