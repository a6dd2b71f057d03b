// trainctl tried as an attacker would (docs/security.md): a second, unprivileged local user beside
// a job, clients without the token, crafted files. Attacks that need a second user run as root
// and drop privileges (setpriv) for both sides: the victim's job runs as one unprivileged uid, the
// attacker as another (nobody); elsewhere they are skipped.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "common/exit_codes.h"
#include "test_util.h"

namespace trainctl::testing {
namespace {

using std::chrono::seconds;

// Each test that runs a job as a victim has its own uid, so its own snapshot root under /dev/shm:
// ctest runs tests side by side, and one test's RemoveAll(root) must not hit another's job.
constexpr uid_t kVictim = 64000;         // runs the job
constexpr uid_t kPrivateVictim = 64001;  // runs the job in SnapshotsArePrivate…
constexpr uid_t kStoreVictim = 64002;    // runs the job in ALocalJobsStore…
constexpr uid_t kAttacker = 65534;  // nobody

// Runs `argv` as `uid` (and gid), to completion.
CommandResult RunAs(uid_t uid, std::vector<std::string> argv, const std::string& cwd,
                    Duration timeout = seconds(120)) {
  const std::string id = std::to_string(uid);
  argv.insert(argv.begin(), {"setpriv", "--reuid=" + id, "--regid=" + id, "--clear-groups"});
  return RunProgram(argv, cwd, timeout);
}

// A scratch directory both users may write in.
struct SharedScratch {
  Scratch s;
  SharedScratch() { ::chmod(s.path("").c_str(), 0777); }
};

std::string SnapshotRoot(uid_t uid) { return "/dev/shm/trainctl-snapshots-" + std::to_string(uid); }

// A trainer job with a snapshot every step, and a restart: a poisoned snapshot would be read.
std::string SnapshotJob(const Scratch& s, const std::string& name) {
  return s.Write(name + ".yaml", "name: " + name + "\nprocs_per_node: 2\noutput_dir: " + s.path(name) +
                                     "\ntrainer:\n  model: cnn\n  data: {limit: 256, test_limit: 64}\n"
                                     "  batch_size: 16\n  max_steps: 6\n  threads: 1\n  snapshot_every: 1\n"
                                     "  eval: false\n");
}

// Another user made the victim's snapshot location first (a directory of theirs, then a link to
// one): the job refuses it, says so, trains from the start, and leaves the attacker's files alone.
TEST(Security, AnotherUsersSnapshotLocationIsRefusedNotUsed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as two users";
  for (const bool link : {false, true}) {
    SharedScratch shared;
    const Scratch& s = shared.s;
    const std::string root = SnapshotRoot(kVictim);
    RemoveAll(root);
    // The attacker's directory, with a "snapshot" of every name a run could have.
    const std::string planted = s.path("attacker");
    auto made = RunAs(kAttacker, {"sh", "-c", "mkdir -m 777 " + planted + " && echo poison > " + planted + "/ckpt-0000099999.safetensors" +
                                                  (link ? " && ln -s " + planted + " " + root : " && mkdir -m 777 " + root +
                                                                                                    " && echo poison > " + root + "/keep")},
                      s.path(""));
    ASSERT_EQ(made.exit.code, 0) << made.output;
    auto r = RunAs(kVictim, {TRAINCTL_BIN, "run", SnapshotJob(s, "victim")}, s.path(""));
    EXPECT_EQ(r.exit.code, 0) << r.output;
    EXPECT_NE(r.output.find("in-memory snapshots are off on this node: " + root +
                            (link ? " is a symbolic link; refusing to follow it"
                                  : " belongs to uid 65534, not to this user (uid 64000); refusing to use it")),
              std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("resuming from"), std::string::npos) << r.output;
    EXPECT_EQ(CountLines(s.Read("victim/metrics.jsonl"), "\"step\": 6"), 1) << "it did not train all its steps";
    // Nothing was written into or pruned from the attacker's directories.
    EXPECT_EQ(s.Read("attacker/ckpt-0000099999.safetensors"), "poison\n");
    if (!link) {
      EXPECT_EQ(*ReadFile(root + "/keep"), "poison\n");
    }
    int entries = 0;
    for (const auto& e : fs::directory_iterator(planted)) entries += e.path().filename() != "" ? 1 : 0;
    EXPECT_EQ(entries, 1);
    RemoveAll(root);
    if (link) ::unlink(root.c_str());
  }
}

// The victim's own snapshots: a directory only it may enter, files only it may read; the other
// user can neither list nor read them while the job runs, and they are gone after it.
TEST(Security, SnapshotsArePrivateToTheirUserAndGoWithTheJob) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as two users";
  SharedScratch shared;
  const Scratch& s = shared.s;
  const std::string root = SnapshotRoot(kPrivateVictim);
  RemoveAll(root);
  std::string spec = s.Write("slow.yaml", "name: slow\nprocs_per_node: 2\noutput_dir: " + s.path("slow") +
                                              "\ntrainer:\n  model: cnn\n  data: {limit: 2048, test_limit: 64}\n"
                                              "  batch_size: 16\n  epochs: 50\n  threads: 1\n  snapshot_every: 1\n"
                                              "  eval: false\n");
  const std::string id = std::to_string(kPrivateVictim);
  Background job({"run", spec}, s.path(""), s.path("run.log"), {},
                 {"setpriv", "--reuid=" + id, "--regid=" + id, "--clear-groups"});
  std::string snapshot;
  ASSERT_TRUE(Eventually([&] {
    std::error_code ec;
    for (const auto& run : fs::directory_iterator(root, ec)) {
      for (const auto& f : fs::directory_iterator(run.path(), ec)) {
        if (f.path().extension() == ".safetensors") snapshot = f.path().string();
      }
    }
    return !snapshot.empty();
  }, seconds(60))) << job.Output();
  struct stat st{};
  ASSERT_EQ(::stat(root.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(st.st_uid, kPrivateVictim);
  ASSERT_EQ(::stat(snapshot.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0u) << "a snapshot others may read";
  auto peek = RunAs(kAttacker, {"sh", "-c", "ls " + root + "; cat " + snapshot + " > /dev/null"}, s.path(""));
  EXPECT_NE(peek.exit.code, 0);
  EXPECT_NE(peek.output.find("Permission denied"), std::string::npos) << peek.output;
  ::kill(job.pid(), SIGTERM);
  job.Wait(seconds(60));
  std::error_code ec;
  EXPECT_TRUE(fs::is_empty(root, ec)) << "the run's snapshots outlived it";
  RemoveAll(root);
}

// A local job's store is a Unix socket that serves only its own user's processes: another user
// is closed before a reply even with the job's token (as if it had leaked); the job's own user
// with the token is answered.
TEST(Security, ALocalJobsStoreRefusesAnotherUserEvenWithTheToken) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as two users";
  SharedScratch shared;
  const Scratch& s = shared.s;
  std::string spec = s.Write("store.yaml", "name: store\noutput_dir: " + s.path("out") +
                                               "\ncommand: [sh, -c, 'echo \"$TRAINCTL_STORE_ADDR $TRAINCTL_STORE_TOKEN\" > " +
                                               s.path("store.tmp") + " && mv " + s.path("store.tmp") + " " +
                                               s.path("store") + " && sleep 120']\n");
  const std::string id = std::to_string(kStoreVictim);
  Background job({"run", spec}, s.path(""), s.path("run.log"), {},
                 {"setpriv", "--reuid=" + id, "--regid=" + id, "--clear-groups"});
  ASSERT_TRUE(Eventually([&] { return !s.Read("store").empty(); }, seconds(60))) << job.Output();
  std::istringstream fields(s.Read("store"));
  std::string addr, token;
  fields >> addr >> token;
  ASSERT_EQ(addr.rfind("unix:@", 0), 0u) << addr;
  // The hello a client sends (op 1, protocol 1, the token), then the reply's first five bytes.
  const std::string probe =
      "import socket, struct, sys\n"
      "s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect('\\0' + sys.argv[1][6:])\n"
      "t = sys.argv[2].encode(); body = bytes([1]) + struct.pack('<qI', 1, len(t)) + t\n"
      "try:\n"
      "  s.sendall(struct.pack('<I', len(body)) + body); head = s.recv(5)\n"
      "except ConnectionError: head = b''  # closed before or after the hello\n"
      "print('answered' if len(head) == 5 and head[4] == 0 else 'closed' if not head else 'refused')\n";
  auto attacker = RunAs(kAttacker, {"/usr/bin/python3", "-c", probe, addr, token}, s.path(""));
  EXPECT_EQ(attacker.output, "closed\n") << attacker.output;
  auto owner = RunAs(kStoreVictim, {"/usr/bin/python3", "-c", probe, addr, token}, s.path(""));
  EXPECT_EQ(owner.output, "answered\n") << owner.output;
  ::kill(job.pid(), SIGTERM);
  job.Wait(seconds(60));
}

// A checkpoint whose data is intact (its CRC passes) but whose metadata is crafted: `trainctl eval`
// names the file and field and exits 1. (It used to die by SIGFPE on classes 0, SIGABRT on a
// shape that is not numbers.)
TEST(Security, EvalOnCraftedCheckpointMetadataIsALocatedError) {
  Scratch s;
  auto seed = ReadFile(std::string(TRAINCTL_SOURCE_DIR) + "/fuzz/seeds/checkpoint/small.safetensors");
  ASSERT_TRUE(seed.ok());
  for (const auto& [from, to, message] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"classes\": \"10\"", "\"classes\": \"00\"", "metadata field 'classes' is '00'"},
           {"\"shape\": \"1,28,28\"", "\"shape\": \"a,28,28\"", "metadata field 'shape' is 'a,28,28'"},
           {"\"norm_std\": \"0.353\"", "\"norm_std\": \"0.000\"", "metadata field 'norm_std' is '0.000'"}}) {
    std::string bytes = *seed;
    ASSERT_NE(bytes.find(from), std::string::npos) << from;
    bytes.replace(bytes.find(from), from.size(), to);  // the same length: the header length holds
    ASSERT_EQ(to.size(), from.size());
    const std::string path = s.Write("crafted.safetensors", bytes);
    auto r = Trainctl({"eval", "--checkpoint", path}, s.path(""));
    EXPECT_FALSE(r.exit.signaled) << r.output;
    EXPECT_EQ(r.exit.code, kExitError) << r.output;
    EXPECT_NE(r.output.find(path + ": " + message), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace trainctl::testing
