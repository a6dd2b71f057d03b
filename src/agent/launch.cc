#include "agent/launch.h"

#include <cstdlib>

#include "agent/warm_python.h"
#include "agent/worker_forks.h"
#include "common/cpus.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "job/paths.h"
#include "job/task_env.h"

namespace trainctl {

WorkerLaunch PlanLaunch(const JobSpec& s, const RoleSpec& role, const LaunchRound& r, const Task& t, int task_restarts,
                        const LaunchSite& site) {
  WorkerLaunch w;
  w.local_rank = t.local;
  w.rank = t.rank;
  w.label = t.role + "-" + std::to_string(t.index);
  w.argv = role.command;
  w.argv.insert(w.argv.end(), role.args.begin(), role.args.end());
  if (role.command.empty()) {  // the built-in trainer: this same binary, `trainctl train`
    w.argv = {site.self_exe, "--log-level", site.debug ? "debug" : "info", "train", "--task", w.label};
    w.fork = true;
  } else if (!s.preload.empty() && IsPythonInterpreter(role.command[0])) {  // a copy of a warm interpreter
    w.fork = true;
    w.preload = s.preload;
  }
  w.env = site.env;
  for (const auto& [k, v] : role.env) SetEnv(&w.env, k, v);
  // Defaults a user or the spec may override.
  if (!GetEnv(w.env, "OMP_NUM_THREADS")) {
    int threads = role.resources.cpus >= 1 ? static_cast<int>(role.resources.cpus) : 1;
    SetEnv(&w.env, "OMP_NUM_THREADS", std::to_string(threads));
  }
  if (s.cpu_bind == "cores") {
    w.cpus = CpuShare(site.cpus, t.local, t.local_size);
    if (t.local == 0 && role.command.empty() && s.trainer.threads > static_cast<int>(w.cpus.size())) {
      LOG_WARN(
          "cpu_bind: cores gives each task {} CPU(s), but trainer.threads is {}: each worker's "
          "threads will take turns on its CPUs",
          w.cpus.size(), s.trainer.threads);
    }
  }
  if (!GetEnv(w.env, "PYTHONUNBUFFERED")) SetEnv(&w.env, "PYTHONUNBUFFERED", "1");
  // As torchrun sets them (the older name, and the newer torch's): a NCCL collective that fails
  // or hangs raises in the program instead of blocking it.
  for (const char* nccl : {"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}) {
    if (!GetEnv(w.env, nccl)) SetEnv(&w.env, nccl, "1");
  }
  // The built-in trainer's parameter servers compute in bursts while the workers wait; their
  // OpenMP threads must sleep between bursts, not spin on the cores the workers need.
  if (role.command.empty() && t.role == "ps" && !GetEnv(w.env, "OMP_WAIT_POLICY")) {
    SetEnv(&w.env, "OMP_WAIT_POLICY", "PASSIVE");
  }

  if (w.fork) {
    w.shared_env = w.env;
    // So that what finds a job's processes by their environment (ps e, the benchmarks' checks
    // for processes left behind) finds its worker server too.
    SetEnv(&w.shared_env, "TRAINCTL_JOB_NAME", s.name);
    // The training ranks' server loads their data once for all its copies.
    if (role.command.empty() && (s.roles.empty() || TrainingRole(t.role))) {
      SetEnv(&w.shared_env, kEnvPreloadSpec, JobSpecToJson(s));
    }
  }
  if (!site.timer_file.empty()) SetEnv(&w.env, "TORCHELASTIC_TIMER_FILE", site.timer_file);
  TaskEnv e;
  e.rank = t.rank;
  e.local_rank = t.local;
  e.world_size = r.world_size;
  e.local_world_size = t.local_size;
  e.group_rank = r.info.group_rank;
  e.group_world_size = r.info.group_world_size;
  e.role_name = t.role;
  e.role_rank = t.index;
  e.role_world_size = t.role_size;
  const size_t colon = r.master.rfind(':');
  e.master_addr = r.master.substr(0, colon);
  e.master_port = std::atoi(r.master.c_str() + colon + 1);
  e.restart_count = r.info.restarts;
  e.max_restarts = s.restart.max_restarts;
  e.run_id = site.run_id;
  if (r.addrs && !r.addrs->empty()) {
    e.tf_config = TfConfig(*r.all, *r.addrs, t);
    e.task_addr = (*r.addrs)[t.rank];
  }
  e.job_name = s.name;
  e.output_dir = s.output_dir;
  e.checkpoint_dir = s.checkpoint_dir;
  e.store_addr = site.store_addr;
  e.store_token = site.store_token;
  e.store_prefix = site.store_prefix;
  e.host = site.host;
  e.round = r.round;
  e.task_restarts = task_restarts;
  e.error_file = paths::ErrorFile(s.output_dir, t.role, t.index, r.round, task_restarts);
  e.tty = site.color_output;  // output reaches a terminal: tasks may redraw a status line
  e.ApplyTo(&w.env);

  w.cwd = s.working_dir;
  w.log_path = paths::TaskLog(s.output_dir, t.role, t.index);
  w.error_file = e.error_file;
  w.log_header = "=== trainctl: run " + site.run_id + ", round " + std::to_string(r.round) + ", restart " +
                 std::to_string(r.info.restarts) +
                 (task_restarts ? ", task restart " + std::to_string(task_restarts) : "") + " ===\n";
  return w;
}

}  // namespace trainctl
