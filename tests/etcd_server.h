// Real etcd (Debian's etcd-server) for tests, on free loopback ports. Construct on the test's
// main thread: PR_SET_PDEATHSIG follows the spawning thread (see SpawnOptions::die_with_parent).
#pragma once

#include <fcntl.h>

#include <fstream>

#include "common/socket.h"
#include "tests/test_util.h"

namespace trainctl::testing {

// TLS and etcd's own auth for an EtcdCluster: the certificates are made with openssl (a CA, the
// server's for 127.0.0.1, a client's), and the users through etcd's JSON gateway before auth is
// enabled: root, and `user` with read-write access to /trainctl/.
struct EtcdSecurity {
  bool tls = false;
  bool client_cert_auth = false;  // etcd's --client-cert-auth: clients need a certificate
  std::string user, password;     // "" : no auth
};

class EtcdCluster {
 public:
  // Members listen on `host` (loopback unless a test gives another address of this machine).
  explicit EtcdCluster(int members, std::string host = "127.0.0.1", EtcdSecurity security = {})
      : host_(std::move(host)), security_(std::move(security)) {
    if (security_.tls) MakeCertificates();
    const std::string scheme = security_.tls ? "https://" : "http://";
    std::vector<std::string> peers;
    std::string initial;
    for (int i = 0; i < members; ++i) {
      client_ports_.push_back(FreePort());
      peers.push_back("http://" + host_ + ":" + std::to_string(FreePort()));
      initial += (i ? "," : "") + Name(i) + "=" + peers.back();
    }
    for (int i = 0; i < members; ++i) {
      std::string client = scheme + host_ + ":" + std::to_string(client_ports_[i]);
      SpawnOptions o;
      o.argv = {"etcd",
                "--name",
                Name(i),
                "--data-dir",
                scratch_.path(Name(i)),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peers[i],
                "--initial-advertise-peer-urls",
                peers[i],
                "--initial-cluster",
                initial,
                "--initial-cluster-state",
                "new",
                "--logger",
                "zap",
                "--log-outputs",
                scratch_.path(Name(i) + ".log")};
      if (security_.tls) {
        o.argv.insert(o.argv.end(), {"--cert-file", cert("server.pem"), "--key-file", cert("server.key")});
        // (etcd asks every client for a certificate once it has a CA to check them against.)
        if (security_.client_cert_auth) {
          o.argv.insert(o.argv.end(), {"--client-cert-auth", "--trusted-ca-file", cert("ca.pem")});
        }
      }
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
    WaitUntilListening();
    if (!security_.user.empty()) EnableAuth();
  }
  // A file of the test certificates: ca.pem, client.pem, client.key.
  std::string cert(const std::string& name) const { return scratch_.path("tls/" + name); }
  ~EtcdCluster() {
    for (size_t i = 0; i < pids_.size(); ++i) Kill(static_cast<int>(i));
  }
  // "host:port" of each member's client URL.
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (int port : client_ports_) out.push_back(host_ + ":" + std::to_string(port));
    return out;
  }
  // SIGSTOP: the member's sockets still accept connections and requests, it answers none.
  void Pause(int member) { ::kill(pids_[member], SIGSTOP); }
  void Kill(int member) {
    if (pids_[member] > 0) {
      ::kill(pids_[member], SIGKILL);
      ::waitpid(pids_[member], nullptr, 0);
      pids_[member] = -1;
    }
  }

  // etcd forgets every token it gave: auth disabled (as root) and enabled again.
  void ForgetTokens() {
    const std::string url = (security_.tls ? "https://" : "http://") + endpoints()[0];
    const std::string script = R"(
import json, ssl, sys, urllib.request
url, tls, ca = sys.argv[1:4]
ctx = ssl.create_default_context(cafile=ca) if tls == "1" else None
def post(path, body, token=None):
    headers = {"Content-Type": "application/json"}
    if token: headers["Authorization"] = token
    req = urllib.request.Request(url + "/v3/" + path, json.dumps(body).encode(), headers)
    return json.loads(urllib.request.urlopen(req, context=ctx, timeout=10).read() or b"{}")
token = post("auth/authenticate", {"name": "root", "password": "root-password"})["token"]
post("auth/disable", {}, token)
post("auth/enable", {})
)";
    SpawnOptions o;
    o.argv = {TRAINCTL_TEST_PYTHON, "-c", script, url, security_.tls ? "1" : "0", cert("ca.pem")};
    o.env = CurrentEnvironment();
    auto r = RunCommand(o, std::chrono::seconds(60));
    ASSERT_TRUE(r.ok() && r->exit.success()) << (r.ok() ? r->output : r.status().ToString());
  }

 private:
  static std::string Name(int i) { return "member" + std::to_string(i); }

  void MakeCertificates() {
    const std::string dir = scratch_.path("tls");
    std::filesystem::create_directories(dir);
    const std::string script =
        "set -e; cd " + dir +
        "; k='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes'\n"
        "openssl req -x509 $k -keyout ca.key -out ca.pem -days 2 -subj /CN=trainctl-test-ca\n"
        "for who in server client; do\n"
        "  openssl req $k -keyout $who.key -out $who.csr -subj /CN=$who\n"
        "  printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' > $who.ext\n"
        "  openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $who.pem -days 2 "
        "-extfile $who.ext\n"
        "done\n";
    SpawnOptions o;
    o.argv = {"sh", "-c", script};
    o.env = CurrentEnvironment();
    auto r = RunCommand(o, std::chrono::seconds(60));
    ASSERT_TRUE(r.ok() && r->exit.success())
        << (r.ok() ? r->output : r.status().ToString()) << " (apt-get install openssl)";
  }

  // Every member listening on its client port; a member that exited instead (a port taken
  // between FreePort() and etcd's bind, say) fails the test here, with its log's last lines,
  // rather than later as a lost quorum.
  void WaitUntilListening() {
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (pids_[i] <= 0) continue;
      bool listening = false;
      Eventually([&] {
        int fd =
            ConnectOnce(host_, static_cast<uint16_t>(client_ports_[i]), Clock::now() + std::chrono::milliseconds(200));
        if (fd >= 0) ::close(fd);
        listening = fd >= 0 && !ProcessGone(pids_[i]);
        return listening || ProcessGone(pids_[i]);
      });
      if (!listening) {
        std::ifstream log(scratch_.path(Name(static_cast<int>(i)) + ".log"));
        std::string line, tail;
        while (std::getline(log, line)) tail = tail.substr(tail.size() > 2000 ? tail.size() - 2000 : 0) + line + "\n";
        ADD_FAILURE() << "etcd " << Name(static_cast<int>(i)) << " is not listening on port " << client_ports_[i]
                      << "; its log ends:\n"
                      << tail;
      }
    }
  }

  // Users, roles and auth through etcd's gateway (Python's urllib: no etcdctl needed).
  void EnableAuth() {
    const std::string url = (security_.tls ? "https://" : "http://") + endpoints()[0];
    const std::string script = R"(
import base64, json, ssl, sys, time, urllib.request
url, tls, ca, cert, key, user, password = sys.argv[1:8]
ctx = None
if tls == "1":
    ctx = ssl.create_default_context(cafile=ca)
def post(path, body, tries=100):
    for i in range(tries):
        try:
            req = urllib.request.Request(url + "/v3/" + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            return urllib.request.urlopen(req, context=ctx, timeout=5).read()
        except Exception as e:
            if i == tries - 1: raise
            time.sleep(0.1)
b64 = lambda s: base64.b64encode(s.encode()).decode()
post("auth/user/add", {"name": "root", "password": "root-password"})
post("auth/role/add", {"name": "root"})
post("auth/user/grant", {"user": "root", "role": "root"})
post("auth/user/add", {"name": user, "password": password})
post("auth/role/add", {"name": "trainctl"})
post("auth/role/grant", {"name": "trainctl", "perm": {"permType": "READWRITE", "key": b64("/trainctl/"),
                                                      "range_end": b64("/trainctl0")}})
post("auth/user/grant", {"user": user, "role": "trainctl"})
post("auth/enable", {})
)";
    SpawnOptions o;
    o.argv = {TRAINCTL_TEST_PYTHON,
              "-c",
              script,
              url,
              security_.tls ? "1" : "0",
              cert("ca.pem"),
              cert("client.pem"),
              cert("client.key"),
              security_.user,
              security_.password};
    o.env = CurrentEnvironment();
    auto r = RunCommand(o, std::chrono::seconds(60));
    ASSERT_TRUE(r.ok() && r->exit.success()) << (r.ok() ? r->output : r.status().ToString());
  }

  std::string host_;
  EtcdSecurity security_;
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
