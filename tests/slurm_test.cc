// `trainctl render --target slurm` end to end against a real Slurm that the test starts on this
// machine (Debian's munge, slurmctld and one slurmd per node, each on its own port): the batch
// script is submitted with sbatch, srun starts one agent per node, the job's outcome is the
// batch job's exit code.
#include <gtest/gtest.h>
#include <pwd.h>

#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

class SlurmCluster {
 public:
  explicit SlurmCluster(int nodes) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string user = ::getpwuid(::geteuid())->pw_name;
    // munge: a fresh key and a private socket.
    std::string key(1024, '\0');
    for (auto& c : key) c = static_cast<char>(std::rand());
    EXPECT_TRUE(AtomicWriteFile(dir_.path("munge.key"), key, 0600).ok());
    Start("munged", {"munged", "-F", "-f", "--socket=" + dir_.path("munge.sock"),
                     "--key-file=" + dir_.path("munge.key"), "--log-file=" + dir_.path("munged.log"),
                     "--pid-file=" + dir_.path("munged.pid"), "--seed-file=" + dir_.path("munged.seed")});
    EXPECT_TRUE(Eventually([&] { return fs::exists(dir_.path("munge.sock")); }, std::chrono::seconds(10)))
        << dir_.Read("munged.out");
    std::string conf =
        "ClusterName=trainctl\nSlurmctldHost=" + std::string(host) +
        "(127.0.0.1)\n"
        "SlurmctldPort=" +
        std::to_string(FreePort()) + "\nSlurmUser=" + user + "\nSlurmdUser=" + user +
        "\nAuthType=auth/munge\nAuthInfo=socket=" + dir_.path("munge.sock") +
        "\nCredType=cred/munge\n"
        "StateSaveLocation=" +
        dir_.path("state") + "\nSlurmdSpoolDir=" + dir_.path("spool-%n") +
        "\nSlurmctldPidFile=" + dir_.path("slurmctld.pid") + "\nSlurmdPidFile=" + dir_.path("slurmd-%n.pid") +
        "\nSlurmctldLogFile=" + dir_.path("slurmctld.log") + "\nSlurmdLogFile=" + dir_.path("slurmd-%n.log") +
        "\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSelectType=select/cons_tres\n"
        "SelectTypeParameters=CR_CPU\nSchedulerType=sched/builtin\nMpiDefault=none\nReturnToService=2\n"
        "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n";
    std::string names;
    for (int i = 1; i <= nodes; ++i) {
      conf += "NodeName=n" + std::to_string(i) + " NodeHostname=" + host +
              " NodeAddr=127.0.0.1 Port=" + std::to_string(FreePort()) + " CPUs=2\n";
      names += (i > 1 ? "," : "") + std::string("n") + std::to_string(i);
    }
    conf += "PartitionName=test Nodes=" + names + " Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE\n";
    fs::create_directories(dir_.path("state"));
    conf_ = dir_.Write("slurm.conf", conf);
    Start("slurmctld", {"slurmctld", "-D", "-c", "-f", conf_});
    for (int i = 1; i <= nodes; ++i) {
      Start("slurmd-n" + std::to_string(i), {"slurmd", "-D", "-N", "n" + std::to_string(i), "-f", conf_});
    }
    EXPECT_TRUE(Eventually(
        [&] {
          auto r = Client({"sinfo", "-h", "-o", "%T %D"});
          return r.exit.code == 0 && r.output == "idle " + std::to_string(nodes) + "\n";
        },
        std::chrono::seconds(60)))
        << "Slurm did not come up: " << dir_.Read("slurmctld.log");
  }
  ~SlurmCluster() {
    for (auto it = pids_.rbegin(); it != pids_.rend(); ++it) ::kill(*it, SIGTERM);
    for (pid_t p : pids_) {
      if (!Eventually([&] { return ::waitpid(p, nullptr, WNOHANG) != 0; }, std::chrono::seconds(10))) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
    }
  }

  // A Slurm client command (sbatch, sinfo...) pointed at this cluster.
  CommandResult Client(std::vector<std::string> argv, const std::string& cwd = "/",
                       Duration timeout = std::chrono::seconds(30),
                       const std::vector<std::pair<std::string, std::string>>& env = {}) const {
    SpawnOptions o;
    o.argv = std::move(argv);
    o.env = CurrentEnvironment();
    SetEnv(&o.env, "SLURM_CONF", conf_);
    for (const auto& [k, v] : env) SetEnv(&o.env, k, v);
    o.cwd = cwd;
    auto r = RunCommand(o, timeout);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : CommandResult{};
  }

 private:
  void Start(const std::string& name, std::vector<std::string> argv) {
    SpawnOptions o;
    o.argv = std::move(argv);
    o.env = CurrentEnvironment();
    int out = ::open(dir_.path(name + ".out").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    o.output_fd = out;
    auto pid = Spawn(o);
    ::close(out);
    if (pid.ok())
      pids_.push_back(*pid);
    else
      ADD_FAILURE() << name << ": " << pid.status().ToString() << " (apt-get install slurmctld slurmd munge)";
  }

  Scratch dir_;

 public:
  std::string conf_;

 private:
  std::vector<pid_t> pids_;
};

// `trainctl render --target slurm` of `spec`: <name>.sbatch in the scratch folder.
void RenderScript(const Scratch& s, const std::string& spec) {
  auto r = Trainctl({"render", spec, "--target", "slurm", "--trainctl", TRAINCTL_BIN, "-o", s.path("")}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
}

// What the batch job printed: <name>-<jobid>.out in the submit directory.
std::string BatchOutput(const Scratch& s, const std::string& name) {
  for (const auto& e : fs::directory_iterator(s.path(""))) {
    if (e.path().filename().string().rfind(name + "-", 0) == 0) return *ReadFile(e.path().string());
  }
  return "";
}

TEST(Slurm, ABatchJobRunsOneAgentPerNodeUnderSrun) {
  SlurmCluster slurm(2);
  Scratch s;
  std::string spec = s.Write(
      "job.yaml", "name: slurm-ranks\nnodes: 2\nprocs_per_node: 2\noutput_dir: " + s.path("out") +
                      "\n"
                      "command: [sh, -c, 'echo rank=$RANK of $WORLD_SIZE node=$GROUP_RANK slurm_node=$SLURM_NODEID']\n"
                      "resources: {cpus: 0.5}\n");
  RenderScript(s, spec);
  const std::string script = s.Read("slurm-ranks.sbatch");
  EXPECT_NE(script.find("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=1\n"),
            std::string::npos)
      << script;
  auto job = slurm.Client({"sbatch", "--wait", s.path("slurm-ranks.sbatch")}, s.path(""), std::chrono::seconds(120));
  const std::string out = BatchOutput(s, "slurm-ranks");
  ASSERT_EQ(job.exit.code, 0) << job.output << out;
  EXPECT_NE(out.find("started 2 node(s) x 2 worker(s) under srun"), std::string::npos) << out;
  // Node ranks by arrival need not follow Slurm's node ids; every rank ran once, two per node.
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(
        CountLines(out, "rank=" + std::to_string(rank) + " of 4 node=" + std::to_string(rank / 2) + " slurm_node="), 1)
        << out;
  }
  EXPECT_EQ(CountLines(out, " slurm_node=0"), 2) << out;
  EXPECT_EQ(CountLines(out, " slurm_node=1"), 2) << out;
}

// Roles in one allocation: trainctl spreads the tasks of every role over the nodes (the ps and
// a worker on the first, two workers on the second) and asks Slurm for what the busiest needs.
TEST(Slurm, AJobWithRolesSpreadsItsTasksOverTheAllocation) {
  SlurmCluster slurm(2);
  Scratch s;
  std::string spec = s.Write(
      "job.yaml", "name: slurm-roles\nnodes: 2\noutput_dir: " + s.path("out") +
                      "\n"
                      "command: [sh, -c, 'echo task $ROLE_NAME-$ROLE_RANK rank=$RANK slurm_node=$SLURM_NODEID']\n"
                      "roles: [{name: ps, success: true, resources: {cpus: 1.5}}, {name: worker, replicas: 3, "
                      "resources: {cpus: 0.5}}]\n");
  RenderScript(s, spec);
  const std::string script = s.Read("slurm-roles.sbatch");
  EXPECT_NE(script.find("#SBATCH --cpus-per-task=2\n"), std::string::npos) << script;  // ps + worker
  auto job = slurm.Client({"sbatch", "--wait", s.path("slurm-roles.sbatch")}, s.path(""), std::chrono::seconds(120));
  const std::string out = BatchOutput(s, "slurm-roles");
  ASSERT_EQ(job.exit.code, 0) << job.output << out;
  for (const std::string task : {"ps-0 rank=0", "worker-0 rank=1", "worker-1 rank=2", "worker-2 rank=3"}) {
    EXPECT_EQ(CountLines(out, "task " + task + " "), 1) << task << "\n" << out;
  }
  EXPECT_EQ(CountLines(out, " slurm_node=0"), 2) << out;
  EXPECT_EQ(CountLines(out, " slurm_node=1"), 2) << out;
}

TEST(Slurm, AFailedJobIsAFailedBatchJobWithTheReport) {
  SlurmCluster slurm(2);
  Scratch s;
  std::string spec =
      s.Write("job.yaml", "name: slurm-fail\nnodes: 2\nprocs_per_node: 1\noutput_dir: " + s.path("out") +
                              "\n"
                              "command: [sh, -c, 'echo disk full >&2; exit 9']\nrestart: {max_restarts: 1}\n");
  RenderScript(s, spec);
  auto job = slurm.Client({"sbatch", "--wait", s.path("slurm-fail.sbatch")}, s.path(""), std::chrono::seconds(120));
  EXPECT_EQ(job.exit.code, 3) << job.output;  // trainctl's exit code: the restart budget is spent
  const std::string out = BatchOutput(s, "slurm-fail");
  EXPECT_NE(out.find("failed after 1 restart(s) (max_restarts: 1)"), std::string::npos) << out;
  EXPECT_NE(out.find("disk full"), std::string::npos) << out;
}

// The verbs for jobs on this machine work for a Slurm batch job too: ps lists it, logs shows its
// tasks' lines, stop cancels it through Slurm (scancel) and status says it was interrupted.
TEST(Slurm, PsLogsAndStopWorkForABatchJob) {
  SlurmCluster slurm(1);
  Scratch s;
  const std::vector<std::pair<std::string, std::string>> env = {{"TRAINCTL_STATE_DIR", s.path("state")},
                                                                {"SLURM_CONF", slurm.conf_}};
  std::string spec = s.Write("job.yaml", "name: slurm-watch\nprocs_per_node: 2\noutput_dir: " + s.path("out") +
                                             "\n"
                                             "command: [sh, -c, 'echo hello from $RANK; exec sleep 300']\n");
  RenderScript(s, spec);
  auto submitted =
      slurm.Client({"sbatch", "--parsable", s.path("slurm-watch.sbatch")}, s.path(""), std::chrono::seconds(30), env);
  ASSERT_EQ(submitted.exit.code, 0) << submitted.output;
  const std::string job_id = submitted.output.substr(0, submitted.output.find_first_of(";\n"));
  CommandResult ps, logs;
  EXPECT_TRUE(Eventually(
      [&] {
        ps = Trainctl({"ps"}, s.path(""), std::chrono::seconds(30), env);
        logs = Trainctl({"logs", "slurm-watch"}, s.path(""), std::chrono::seconds(30), env);
        return ps.output.find("running") != std::string::npos && CountLines(logs.output, "hello from") == 2;
      },
      std::chrono::seconds(60)))
      << ps.output << logs.output << BatchOutput(s, "slurm-watch");
  EXPECT_NE(ps.output.find("slurm-watch"), std::string::npos) << ps.output;
  EXPECT_NE(logs.output.find("hello from 1"), std::string::npos) << logs.output;
  auto stopped = Trainctl({"stop", "slurm-watch"}, s.path(""), std::chrono::seconds(90), env);
  EXPECT_EQ(stopped.exit.code, 0) << stopped.output;
  EXPECT_NE(stopped.output.find("scancel " + job_id), std::string::npos) << stopped.output;
  EXPECT_TRUE(Eventually(
      [&] {
        return slurm.Client({"squeue", "-h"}).output.empty();
      },
      std::chrono::seconds(60)))
      << slurm.Client({"squeue"}).output;
  auto status = Trainctl({"status", "slurm-watch"}, s.path(""), std::chrono::seconds(30), env);
  EXPECT_NE(status.output.find("interrupted"), std::string::npos) << status.output << BatchOutput(s, "slurm-watch");
}

// trainctl bench with target slurm: each experiment is a batch job (the trainctl job's own
// script, a peer wrapped), waited on, its figures gathered from the shared results folder.
TEST(Slurm, BenchRunsEachExperimentAsABatchJob) {
  SlurmCluster slurm(2);
  Scratch s;
  s.Write("m.yaml",
          "name: onslurm\ntarget: slurm\n"
          "spec: {name: sj, nodes: 2, command: [sh, -c, 'echo rank $RANK on slurm node $SLURM_NODEID']}\n"
          "axes: {procs_per_node: [1, 2]}\n"
          "peers:\n  - name: peer\n    command: [sh, -c, 'echo \"{\\\"epoch_seconds\\\": 0.5, "
          "\\\"epoch_samples_per_s\\\": 12{procs_per_node}}\"; exit $(({procs_per_node} - 1))']\n");
  auto r = Trainctl({"bench", "m.yaml", "--results", s.path("results")}, s.path(""), std::chrono::seconds(240),
                    {{"SLURM_CONF", slurm.conf_}});
  EXPECT_EQ(r.exit.code, 1) << "the peer at 2 fails\n" << r.output;
  std::string dir;
  for (const auto& e : fs::directory_iterator(s.path("results/onslurm"))) dir = e.path().string();
  const std::string csv = s.Read(dir.substr(s.path("").size()) + "/results.csv");
  EXPECT_NE(csv.find("trainctl-procs_per_node_1,trainctl,1,1,2,succeeded,0,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("trainctl-procs_per_node_2,trainctl,1,2,4,succeeded,0,"), std::string::npos) << csv;
  EXPECT_NE(csv.find("peer-procs_per_node_1,peer,1,1,2,succeeded,0,"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",121.0,"), std::string::npos) << "the peer's figures, from its batch job's output\n" << csv;
  EXPECT_NE(csv.find("peer-procs_per_node_2,peer,1,2,4,failed,1,"), std::string::npos) << csv;
  // The trainctl job ran under srun on both nodes: its batch output is in its output folder.
  std::string batch;
  for (const auto& e : fs::directory_iterator(dir + "/experiments/trainctl-procs_per_node_2/output")) {
    // The bench's job name, not the spec's: bench-<matrix name>-<Slurm job id>.out
    if (e.path().filename().string().rfind("bench-onslurm-", 0) == 0) batch = *ReadFile(e.path().string());
  }
  EXPECT_NE(batch.find("under srun"), std::string::npos) << batch;
  EXPECT_EQ(CountLines(batch, "on slurm node 1"), 2) << batch;
}

TEST(Slurm, RunningOutsideAnAllocationIsNamed) {
  Scratch s;
  std::string spec = s.Write("job.yaml", "name: x\ncommand: [true]\n");
  auto r = Trainctl({"run", spec, "--target", "slurm"}, s.path(""), std::chrono::seconds(30), {{"SLURM_JOB_ID", ""}});
  EXPECT_EQ(r.exit.code, 2);
  EXPECT_NE(r.output.find("--target slurm runs inside a Slurm allocation"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace trainctl::testing
