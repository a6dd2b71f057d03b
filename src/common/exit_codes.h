// trainctl's exit codes, documented in `trainctl --help` and docs/cli.md.
#pragma once

namespace trainctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;              // trainctl itself failed (I/O, store lost...)
inline constexpr int kExitInvalidSpec = 2;        // bad job spec or command line
inline constexpr int kExitWorkerFailed = 3;       // a worker failed after the restart budget
inline constexpr int kExitRendezvousTimeout = 4;  // nodes did not all join in time
inline constexpr int kExitJobTimeout = 5;         // timeouts.job passed
inline constexpr int kExitInterrupted = 130;      // Ctrl-C / SIGTERM / SIGHUP

// The table above, for the help of the verbs that run a job (and docs/cli.md).
inline constexpr const char* kExitCodesHelp = R"(Exit codes:
  0    the job succeeded (validate: the spec is valid)
  1    trainctl itself failed (I/O error, lost the job's store, mpirun or srun could not start the agents)
  2    invalid job spec or command line
  3    a worker failed and the restart budget (restart.max_restarts) is spent
  4    rendezvous timed out: not every node joined within timeouts.rendezvous
  5    the job ran longer than timeouts.job
  130  interrupted (Ctrl-C, SIGTERM or SIGHUP); everything trainctl started is stopped)";

// Whether `code` is one of the above (an agent's exit); others come from mpirun or srun.
inline constexpr bool IsTrainctlExitCode(int code) {
  return (code >= kExitOk && code <= kExitJobTimeout) || code == kExitInterrupted;
}

}  // namespace trainctl
