// The end of a local job's run, for LocalLauncher: its status.json and the report on stderr (the
// root cause, not "child failed"), from the records the agents left in the job's store.
#pragma once

#include <string>

#include "common/duration.h"
#include "jobspec/job_spec.h"
#include "store/store.h"

namespace trainctl {

// Writes spec.output_dir's status.json and prints the report of a run that started at `start`
// and that its agents ended with `final_code` (`stop_reason`: why it was stopped, if it was).
// Returns the job's exit code: `final_code`, or an error when the store was lost, whatever the
// agents said.
int ReportRun(const JobSpec& spec, Store& store, const std::string& run_id, Clock::time_point start, int final_code,
              std::string stop_reason);

}  // namespace trainctl
