#include "launch/torchrun/torchrun_launcher.h"

#include "common/fs.h"
#include "common/log.h"
#include "job/run_status.h"
#include "job/runs.h"
#include "launch/local/local_launcher.h"

namespace trainctl {

int TorchrunHostLauncher::Run(const JobSpec& spec, const LaunchOptions& options) {
  const auto start = Clock::now();
  AgentProcessOptions a = agent_;
  a.spec = &spec;
  a.color = options.color_output;
  const runs::RunEntry entry = RunEntryFor(spec, a.run_id, "torchrun");
  Status st = MakeDirs(spec.output_dir);
  if (st.ok()) st = runs::Register(entry);
  if (st.ok()) st = WriteRunningStatus(entry);
  if (!st.ok()) LOG_WARN("trainctl ps will not list this run: {}", st.message());
  const int code = RunAgentProcess(a);
  if (Status w = WriteRunStatus(spec.output_dir, RunStatus::Ended(spec.name, a.run_id, code, Elapsed(start)));
      !w.ok()) {
    LOG_WARN("{}", w.message());
  }
  return code;
}

}  // namespace trainctl
