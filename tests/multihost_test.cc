// Several hosts on one machine: each host is a network namespace with its own address, joined to
// the others by a veth pair on a bridge. One agent runs per host (`ip netns exec`), the job's
// rounds are held on a real etcd listening on the bridge, and the built-in trainer's Gloo traffic
// crosses the veths as real TCP. A host's link is cut and brought back, and a host's agent is
// killed. Needs CAP_NET_ADMIN (root); skipped without it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "common/exit_codes.h"
#include "common/strings.h"
#include "jobspec/job_spec.h"
#include "store/etcd/etcd_store.h"
#include "tests/etcd_server.h"
#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

using std::chrono::seconds;

Status Ip(const std::vector<std::string>& args) {
  SpawnOptions o;
  o.argv = {"ip"};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = CurrentEnvironment();
  auto r = RunCommand(o, seconds(10));
  if (!r.ok()) return r.status();
  if (!r->exit.success()) return Internal("ip " + Join(args, " ") + ": " + r->output);
  return Status::Ok();
}

// Hosts h0..hN-1 at 10.213.<n>.10+i, and the bridge (where etcd listens) at 10.213.<n>.1.
class Hosts {
 public:
  explicit Hosts(int count) : tag_("tc" + std::to_string(::getpid() % 100000)) {
    subnet_ = "10.213." + std::to_string(::getpid() % 250 + 1) + ".";
    status_ = Ip({"link", "add", Bridge(), "type", "bridge"});
    if (status_.ok()) status_ = Ip({"addr", "add", gateway() + "/24", "dev", Bridge()});
    if (status_.ok()) status_ = Ip({"link", "set", Bridge(), "up"});
    for (int i = 0; i < count && status_.ok(); ++i) {
      names_.push_back(tag_ + "-h" + std::to_string(i));
      for (auto args : std::vector<std::vector<std::string>>{
               {"netns", "add", ns(i)},
               {"link", "add", Veth(i), "type", "veth", "peer", "name", "eth0", "netns", ns(i)},
               {"link", "set", Veth(i), "master", Bridge(), "up"},
               {"-n", ns(i), "addr", "add", addr(i) + "/24", "dev", "eth0"},
               {"-n", ns(i), "link", "set", "eth0", "up"},
               {"-n", ns(i), "link", "set", "lo", "up"}}) {
        if (status_.ok()) status_ = Ip(args);
      }
    }
  }
  ~Hosts() {
    for (size_t i = 0; i < names_.size(); ++i) auto ignored = Ip({"netns", "del", ns(i)});
    auto ignored = Ip({"link", "del", Bridge()});
  }
  const Status& status() const { return status_; }
  std::string ns(int i) const { return names_[i]; }
  std::string addr(int i) const { return subnet_ + std::to_string(10 + i); }
  std::string gateway() const { return subnet_ + "1"; }
  Status Cut(int i) { return Ip({"link", "set", Veth(i), "down"}); }
  Status Restore(int i) { return Ip({"link", "set", Veth(i), "up"}); }

 private:
  std::string Bridge() const { return tag_ + "b"; }
  std::string Veth(int i) const { return tag_ + "v" + std::to_string(i); }
  std::string tag_, subnet_;
  std::vector<std::string> names_;
  Status status_;
};

// `trainctl agent` inside host `i`'s namespace, its output in a file.
class HostAgent {
 public:
  HostAgent(const Hosts& hosts, int i, const std::string& run_id, const std::string& store, const std::string& log,
            const std::string& log_level = "info")
      : log_(log) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    SpawnOptions o;
    o.argv = {"ip",      "netns", "exec",     hosts.ns(i), TRAINCTL_BIN, "--log-level",
              log_level, "agent", "--run-id", run_id,      "--host",     hosts.addr(i)};
    o.env = CurrentEnvironment();
    SetEnv(&o.env, "TRAINCTL_AGENT_STORE", store);
    o.output_fd = fd;
    o.new_process_group = false;
    auto pid = Spawn(o);  // `ip netns exec` execs the agent: this is the agent's pid
    ::close(fd);
    EXPECT_TRUE(pid.ok()) << pid.status().ToString();
    pid_ = pid.ok() ? *pid : -1;
  }
  ~HostAgent() {
    if (pid_ > 0 && !ProcessGone(pid_)) ::kill(pid_, SIGKILL);
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  std::string Output() const {
    auto text = ReadFile(log_);
    return text.ok() ? *text : "";
  }
  // The exit, or nullopt if it is still running after `timeout`.
  std::optional<ExitInfo> Wait(Duration timeout) {
    int status = 0;
    if (!Eventually([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, timeout)) {
      return std::nullopt;
    }
    pid_ = -1;
    return ExitInfo::FromWaitStatus(status);
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
};

std::string HostName() {
  char name[256] = {0};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// Step records in metrics.jsonl with this restart count.
int Steps(const Scratch& s, int restart) {
  int n = 0;
  for (const auto& line : SplitLines(s.Read("out/metrics.jsonl"))) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    n += j.is_object() && j.contains("loss") && j["restart"] == restart;
  }
  return n;
}

TEST(MultiHost, CutLinkLostHostAndARejoiningHostOverRealTcp) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces";
  Hosts hosts(2);
  if (!hosts.status().ok()) GTEST_SKIP() << "no network namespaces here: " << hosts.status().ToString();
  EtcdCluster etcd(1, hosts.gateway());
  const std::string store_url = "etcd://" + etcd.endpoints()[0];
  const std::string run_id = "multihost-" + std::to_string(::getpid());

  // What the launcher does for a local job: publish the spec under the run's prefix.
  Scratch s;
  auto spec = ParseJobSpec(R"(name: multihost
nodes: {min: 1, max: 2}
timeouts: {heartbeat: 5s, last_call: 8s, collective: 3s, stop_grace: 2s, rendezvous: 60s}
output_dir: )" + s.path("out") +
                               R"(
trainer:
  model: cnn
  data: {dataset: synthetic, samples: 20000}
  epochs: 1000
  batch_size: 16
  threads: 1
  log_every: 1
  checkpoint_every: 20
  eval: false
)",
                           "multihost.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EtcdStoreOptions eo;
  eo.endpoints = etcd.endpoints();
  auto client = EtcdStore::Connect(eo);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  PrefixStore store(client->get(), "/trainctl/" + run_id + "/");
  ASSERT_TRUE(store.Set("spec", JobSpecToJson(*spec)).ok());

  // (A heartbeat of 5 s: with 2 s a rejoined agent starved by a loaded 2-core machine, a build
  // beside the suite, was once taken for lost at once. A last call of 8 s: round 0 closes that
  // long after host 0 joins, and host 1's agent must have started and joined by then; with 1 s,
  // CI's loaded machine once started it too late, round 0 trained host 0 alone and the rounds
  // below were one off, as a test that starts host 1's agent 2.5 s late fails.)
  // Host 0 joins first, so it is group rank 0 (ranks go by arrival) and logs the rounds.
  auto a = std::make_unique<HostAgent>(hosts, 0, run_id, store_url, s.path("a.log"));
  ASSERT_TRUE(Eventually([&] {
    auto joined = store.TryGet("round/0/member/0");  // its rendezvous record: it took slot 0
    return joined.ok() && joined->has_value();
  })) << a->Output();
  auto b = std::make_unique<HostAgent>(hosts, 1, run_id, store_url, s.path("b.log"));
  ASSERT_TRUE(Eventually([&] { return Steps(s, 0) >= 3; }, seconds(60))) << a->Output() << b->Output();
  // Gloo between the hosts: each rank announced the address of its own host.
  for (int rank = 0; rank < 2; ++rank) {
    auto where = store.TryGet("comm/0/rank/" + std::to_string(rank) + "/host");
    ASSERT_TRUE(where.ok() && where->has_value());
    EXPECT_NE((*where)->find("(" + hosts.addr(rank) + ", pid"), std::string::npos) << **where;
  }

  // Cut host 1 off. Host 0 notices (its heartbeat watch, or its rank 0 in the allreduce) and
  // goes on alone; host 1's agent cannot reach the store, stops its worker and exits.
  ASSERT_TRUE(hosts.Cut(1).ok());
  ASSERT_TRUE(Eventually([&] { return Steps(s, 1) >= 3; }, seconds(60))) << a->Output();
  // The report names host 1 by its address: as the node that went silent, or as the rank that
  // never reached the allreduce, whichever host 0 saw first.
  const std::string lost = a->Output();
  EXPECT_TRUE(lost.find("node 1 (" + HostName() + "/" + hosts.addr(1)) != std::string::npos ||
              lost.find("rank 1 on " + HostName() + " (" + hosts.addr(1)) != std::string::npos)
      << lost;
  EXPECT_NE(lost.find("round 1: 1 node(s), world size 1 (restart 1 of 3)"), std::string::npos) << lost;
  auto b_exit = b->Wait(seconds(60));
  ASSERT_TRUE(b_exit.has_value()) << "host 1's agent hung without its store:\n" << b->Output();
  EXPECT_NE(b_exit->code, 0) << b->Output();
  EXPECT_NE(b->Output().find("lost the job's store"), std::string::npos) << b->Output();

  // Bring the link back and start host 1's agent again: it is admitted at the next round, as a
  // membership change that spends no restart.
  ASSERT_TRUE(hosts.Restore(1).ok());
  // At debug level: under load this agent once printed nothing for 60 s; its steps say where.
  b = std::make_unique<HostAgent>(hosts, 1, run_id, store_url, s.path("b2.log"), "debug");
  // The round's node 0 reports it: either host, whichever joined the round first.
  ASSERT_TRUE(Eventually(
      [&] {
        const std::string round2 = "round 2: 2 node(s), world size 2 (restart 1 of 3)";
        return a->Output().find(round2) != std::string::npos || b->Output().find(round2) != std::string::npos;
      },
      seconds(60)))
      << a->Output() << b->Output();
  int before = Steps(s, 1);
  ASSERT_TRUE(Eventually([&] { return Steps(s, 1) >= before + 3; }, seconds(60))) << a->Output();

  // Kill host 1's agent: its worker dies with it; host 0 goes on alone.
  ASSERT_EQ(::kill(b->pid(), SIGKILL), 0);
  ASSERT_TRUE(Eventually([&] { return Steps(s, 2) >= 3; }, seconds(60))) << a->Output();
  // Its peer sees that first as the allreduce failing (a reset, a closed connection, a timeout),
  // or as the missed heartbeat.
  EXPECT_TRUE(a->Output().find("was lost: its agent sent no heartbeat for 5s") != std::string::npos ||
              a->Output().find("allreduce failed on rank") != std::string::npos)
      << a->Output();

  // Stop the job: nothing of it is left on either host.
  ASSERT_EQ(::kill(a->pid(), SIGTERM), 0);
  auto a_exit = a->Wait(seconds(30));
  ASSERT_TRUE(a_exit.has_value()) << a->Output();
  EXPECT_EQ(a_exit->code, kExitInterrupted) << a->Output();
  EXPECT_TRUE(Eventually([&] { return ProcessesWithEnv({"TRAINCTL_RUN_ID=" + run_id}).empty(); }, seconds(10)));
}

// `trainctl torchrun` on two hosts with torchrun's c10d command line: the host the endpoint
// names serves the job's store and the other joins it (it must not serve one of its own because
// the port happens to be free on it), over real TCP between the namespaces.
TEST(MultiHost, TorchrunOnTwoHostsMeetsAtTheEndpointsHost) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces";
  Hosts hosts(2);
  if (!hosts.status().ok()) GTEST_SKIP() << "no network namespaces here: " << hosts.status().ToString();
  Scratch s;
  const std::string endpoint = hosts.addr(0) + ":29400";
  std::vector<std::unique_ptr<Background>> hosts_runs;
  for (int i = 0; i < 2; ++i) {
    // The joining host first: it must wait for the endpoint's host, not serve a store itself.
    const int h = 1 - i;
    hosts_runs.push_back(std::make_unique<Background>(
        std::vector<std::string>{"torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                                 "--rdzv-endpoint", endpoint, "--rdzv-id", "meet", "--rdzv-conf", "join_timeout=60",
                                 "--log-dir", s.path("out" + std::to_string(h)), "--no-python", "/bin/sh", "-c",
                                 "echo \"$RANK of $WORLD_SIZE\" >> " + s.path("ranks")},
        s.path(""), s.path("host" + std::to_string(h) + ".log"),
        std::vector<std::pair<std::string, std::string>>{{"TRAINCTL_TOKEN", "0123456789abcdef0123456789abcdef"},
                                                         {"TRAINCTL_STATE_DIR", s.path("state" + std::to_string(h))}},
        std::vector<std::string>{"ip", "netns", "exec", hosts.ns(h)}));
    if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(hosts_runs[1 - h]->Wait(seconds(60)).code, 0) << s.Read("host" + std::to_string(h) + ".log");
  }
  EXPECT_NE(s.Read("host0.log").find("serving the job's store at " + endpoint), std::string::npos)
      << s.Read("host0.log");
  EXPECT_NE(s.Read("host1.log").find("joining the job's store at " + endpoint), std::string::npos)
      << s.Read("host1.log");
  EXPECT_EQ(CountLines(s.Read("ranks"), "0 of 2"), 1) << s.Read("ranks");
  EXPECT_EQ(CountLines(s.Read("ranks"), "1 of 2"), 1) << s.Read("ranks");
}

}  // namespace
}  // namespace trainctl::testing
