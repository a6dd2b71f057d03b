// The bench's experiment scheduler (`trainctl bench MATRIX`): every experiment of a matrix run
// here (K at once) or submitted to Slurm, each one's figures gathered from its own records, the
// result set written after each experiment (so a crash or Ctrl-C leaves what was done), every
// process stopped on the way out; or the result set of experiments that ran elsewhere (Argo)
// collected. cli/bench.cc parses the command line and hands it a matrix.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/matrix.h"
#include "bench/results.h"
#include "common/status.h"
#include "jobspec/job_spec.h"

namespace trainctl::bench {

class Scheduler {
 public:
  // Resolves a trainctl experiment's spec against the matrix's base file (its programs' paths)
  // and, with `preflight` (once per point), checks what can be checked before it runs: the CLI's
  // preflight.
  using Check = std::function<Status(JobSpec* spec, const std::string& base_file, bool preflight)>;
  // `dir`: the result set's directory; `base_file`: the spec every point overrides.
  Scheduler(Matrix m, std::string dir, std::string base_file, Check check);
  ~Scheduler();

  // Resolves every experiment's spec before anything runs (a bad point stops the bench at once,
  // kInvalidArgument naming each), writes each one's config, and the result set so far; `done`:
  // a resumed set's figures, whose finished experiments are kept.
  Status Prepare(const std::vector<Figures>& done);
  // Runs what is not done yet (`self`: the trainctl binary); returns the bench's exit code.
  int Run(const std::string& self);
  // The result set of experiments that ran elsewhere: each one's state from its own records.
  int Collect();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainctl::bench
