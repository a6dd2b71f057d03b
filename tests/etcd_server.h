// Real etcd (Debian's etcd-server) for tests, on free loopback ports. Construct on the test's
// main thread: PR_SET_PDEATHSIG follows the spawning thread (see SpawnOptions::die_with_parent).
#pragma once

#include <fcntl.h>

#include "tests/test_util.h"

namespace trainctl::testing {

class EtcdCluster {
 public:
  // Members listen on `host` (loopback unless a test gives another address of this machine).
  explicit EtcdCluster(int members, std::string host = "127.0.0.1") : host_(std::move(host)) {
    std::vector<std::string> peers;
    std::string initial;
    for (int i = 0; i < members; ++i) {
      client_ports_.push_back(FreePort());
      peers.push_back("http://" + host_ + ":" + std::to_string(FreePort()));
      initial += (i ? "," : "") + Name(i) + "=" + peers.back();
    }
    for (int i = 0; i < members; ++i) {
      std::string client = "http://" + host_ + ":" + std::to_string(client_ports_[i]);
      SpawnOptions o;
      o.argv = {"etcd", "--name", Name(i), "--data-dir", scratch_.path(Name(i)),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--logger", "zap", "--log-outputs", scratch_.path(Name(i) + ".log")};
      o.env = CurrentEnvironment();
      int out = ::open(scratch_.path(Name(i) + ".out").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      o.output_fd = out;  // etcd's own chatter stays out of the test output
      auto pid = Spawn(o);
      ::close(out);
      if (!pid.ok()) {
        ADD_FAILURE() << pid.status().ToString() << " (apt-get install etcd-server)";
        pids_.push_back(-1);
        continue;
      }
      pids_.push_back(*pid);
    }
  }
  ~EtcdCluster() {
    for (size_t i = 0; i < pids_.size(); ++i) Kill(static_cast<int>(i));
  }
  // "host:port" of each member's client URL.
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (int port : client_ports_) out.push_back(host_ + ":" + std::to_string(port));
    return out;
  }
  void Kill(int member) {
    if (pids_[member] > 0) {
      ::kill(pids_[member], SIGKILL);
      ::waitpid(pids_[member], nullptr, 0);
      pids_[member] = -1;
    }
  }

 private:
  static std::string Name(int i) { return "member" + std::to_string(i); }
  std::string host_;
  Scratch scratch_;
  std::vector<int> client_ports_;
  std::vector<pid_t> pids_;
};

// One single-member etcd for the whole test process, started on first use.
inline EtcdCluster& SharedEtcd() {
  static EtcdCluster etcd(1);
  return etcd;
}

}  // namespace trainctl::testing
