#include "launch/local/report.h"

#include <cstdio>
#include <cstdlib>
#include <optional>

#include "common/exit_codes.h"
#include "common/log.h"
#include "job/keys.h"
#include "job/records.h"
#include "job/run_status.h"
#include "launch/local/local_launcher.h"
#include "rendezvous/round_end.h"

namespace trainctl {

int ReportRun(const JobSpec& spec, Store& store, const std::string& run_id, Clock::time_point start, int final_code,
              std::string stop_reason) {
  // A store that is gone (an etcd lost) is the cause to report, not something to wait on again
  // for every record.
  std::string restarts = "0";
  Status store_lost;
  if (auto r = store.TryGet(keys::kRestarts); !r.ok()) {
    store_lost = r.status();
  } else if (r->has_value()) {
    restarts = **r;
  }
  if (!store_lost.ok()) {
    if (final_code == kExitOk) final_code = kExitError;
    if (stop_reason.empty() || final_code == kExitError) stop_reason = "lost the job's store: " + store_lost.message();
  }
  RunStatus status = RunStatus::Ended(spec.name, run_id, final_code, Elapsed(start));
  status.restarts = std::atoi(restarts.c_str());
  status.store_error = store_lost.message();
  auto record = [&](const std::string& key) -> std::optional<FailureRecord> {
    if (!store_lost.ok()) return std::nullopt;
    auto text = store.TryGet(key);
    if (!text.ok() || !text->has_value()) return std::nullopt;
    auto rec = FailureRecord::FromJson(**text);
    return rec.ok() ? std::optional<FailureRecord>(*rec) : std::nullopt;
  };
  // Single-task restarts and failures that the job went on without (roles with on_failure).
  if (store_lost.ok()) {
    if (auto n = store.TryGet(keys::kTaskRestarts); n.ok() && n->has_value()) {
      status.task_restarts = RestartBudget{spec.restart.max_restarts}.TaskRestartsDone(std::atoi((*n)->c_str()));
    }
    if (auto n = store.TryGet(keys::kIgnoredFailures); n.ok() && n->has_value()) {
      status.ignored_failures = std::atoi((*n)->c_str());
      status.last_ignored_failure = record(keys::kLastIgnoredFailure);
    }
  }
  switch (final_code) {
    case kExitOk:
      LOG_INFO("job {} succeeded in {} ({} restart{})", spec.name, status.elapsed, restarts,
               restarts == "1" ? "" : "s");
      break;
    case kExitInvalidSpec:
    case kExitWorkerFailed:
      if (auto rec = record(keys::kLastFailure)) {
        status.failure = rec;
        const bool no_retry = rec->kind == FailureKind::kStart || rec->kind == FailureKind::kConfig;
        std::string budget = no_retry
                                 ? ""
                                 : " after " + restarts +
                                       " restart(s) (max_restarts: " + std::to_string(spec.restart.max_restarts) + ")";
        // The first failure across the job, by the tasks' error files, when it is not the one
        // seen first (a rank that raised earlier but exited later, or was stopped).
        if (auto c = record(keys::RoundRootCause(rec->round));
            c && c->rank != rec->rank && (rec->error_time == 0 || c->Before(*rec))) {
          status.root_cause = c;
          std::fprintf(stderr,
                       "trainctl: job %s failed%s.\nroot cause (first observed failure, by the tasks' "
                       "error files): %s\nthen: %s",
                       spec.name.c_str(), budget.c_str(), c->Report().c_str(), rec->Report().c_str());
        } else {
          std::fprintf(stderr, "trainctl: job %s failed%s: %s", spec.name.c_str(), budget.c_str(),
                       rec->Report().c_str());
        }
      } else if (final_code == kExitInvalidSpec) {  // an agent refused the job before any round
        LOG_ERROR("job {} failed: {}", spec.name, stop_reason.empty() ? "see the log above" : stop_reason);
      }
      break;
    case kExitRendezvousTimeout:
      LOG_ERROR("job {} failed: not every node joined within timeouts.rendezvous ({})", spec.name,
                FormatDuration(spec.timeouts.rendezvous));
      break;
    case kExitInterrupted:
      LOG_WARN("job {} stopped: {}", spec.name, stop_reason);
      break;
    case kExitJobTimeout:
      LOG_ERROR("job {} stopped: {}", spec.name, stop_reason);
      break;
    default:
      LOG_ERROR("job {} failed: {}", spec.name, stop_reason.empty() ? "see the log above" : stop_reason);
  }
  if (Status st = WriteRunStatus(spec.output_dir, status); !st.ok()) LOG_ERROR("{}", st.message());
  return final_code;
}

}  // namespace trainctl
