// `trainctl torchrun`: torchrun's flags in both spellings mapped onto a job spec (--print-spec),
// the flags trainctl cannot honour named, one host as `run` does, and two torchrun commands on
// this machine forming one 2-host job with Debian's real PyTorch (gloo allreduce).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "common/exit_codes.h"
#include "common/socket.h"
#include "tests/etcd_server.h"
#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

using std::chrono::seconds;
using Env = std::vector<std::pair<std::string, std::string>>;

TEST(Torchrun, EveryFlagMeansTheSameInBothSpellingsAndMapsOntoTheSpec) {
  Scratch s;
  // Each flag written as torchrun's documentation (dashes) and as older scripts do (underscores).
  const std::vector<std::vector<std::string>> flags = {
      {"--nnodes", "1:3"},
      {"--nproc-per-node", "3"},
      {"--max-restarts", "4"},
      {"--rdzv-backend", "c10d"},
      {"--rdzv-endpoint", "10.0.0.1:29400"},
      {"--rdzv-id", "exp7"},
      {"--rdzv-conf", "join_timeout=90,last_call_timeout=2,read_timeout=20"},
      {"--log-dir", "/tmp/exp7"},
      {"--monitor-interval", "5"},
      {"--redirects", "3"},
      {"--tee", "3"},
      {"--start-method", "spawn"},
      {"--local-addr", "10.0.0.2"},
      {"--master-addr", "10.0.0.1"},
      {"--master-port", "29500"},
      {"--node-rank", "0"},
      {"--no-python"},
  };
  std::vector<std::string> dashes = {"torchrun", "--print-spec"}, unders = dashes;
  for (const auto& f : flags) {
    dashes.insert(dashes.end(), f.begin(), f.end());
    std::string u = f[0];
    std::replace(u.begin() + 2, u.end(), '-', '_');
    unders.push_back(u);
    unders.insert(unders.end(), f.begin() + 1, f.end());
  }
  for (auto* argv : {&dashes, &unders}) argv->insert(argv->end(), {"/bin/sh", "-c", "echo $RANK"});
  auto a = Trainctl(dashes, s.path(""));
  auto b = Trainctl(unders, s.path(""));
  ASSERT_EQ(a.exit.code, 0) << a.output;
  ASSERT_EQ(b.exit.code, 0) << b.output;
  EXPECT_EQ(a.output, b.output);
  // The spec it prints is one trainctl run accepts, and says what the flags said.
  s.Write("spec.yaml", a.output);
  auto printed = Trainctl({"validate", "spec.yaml", "--print"}, s.path(""));
  ASSERT_EQ(printed.exit.code, 0) << printed.output << a.output;
  auto j = nlohmann::json::parse(printed.output);
  EXPECT_EQ(j["name"], "exp7");
  EXPECT_EQ(j["nodes"]["min"], 1);
  EXPECT_EQ(j["nodes"]["max"], 3);
  EXPECT_EQ(j["procs_per_node"], 3);
  EXPECT_EQ(j["restart"]["max_restarts"], 4);
  EXPECT_EQ(j["timeouts"]["rendezvous"], "1m30s");
  EXPECT_EQ(j["timeouts"]["last_call"], "2s");
  EXPECT_EQ(j["output_dir"], "/tmp/exp7");
  EXPECT_EQ(j["command"], (std::vector<std::string>{"/bin/sh", "-c", "echo $RANK"})) << "--no-python";

  // A script through python3, and a module; the script's own flags stay its own.
  auto script = Trainctl(
      {"torchrun", "--print-spec", "--standalone", "--nproc_per_node=2", "train.py", "--lr", "0.1", "--nnodes", "9"},
      s.path(""));
  EXPECT_NE(script.output.find(
                "  - python3\n  - \"-u\"\n  - train.py\n  - \"--lr\"\n  - \"0.1\"\n  - \"--nnodes\"\n  - \"9\"\n"),
            std::string::npos)
      << script.output;
  EXPECT_NE(script.output.find("nodes: 1\n"), std::string::npos) << script.output;
  auto module = Trainctl({"torchrun", "--print-spec", "-m", "pkg.train"}, s.path(""));
  EXPECT_NE(module.output.find("  - \"-m\"\n  - pkg.train\n"), std::string::npos) << module.output;
  EXPECT_NE(module.output.find("name: train\n"), std::string::npos) << module.output;
}

TEST(Torchrun, WhatTrainctlCannotHonourIsNamed) {
  Scratch s;
  for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--role", "trainer", "t.py"}, "--role trainer: trainctl's tasks of a one-role job are named 'worker'"},
           {{"--rdzv-conf", "keep_alive=3", "t.py"}, "--rdzv-conf: trainctl knows join_timeout"},
           {{"--rdzv-conf", "join_timeout=soon", "t.py"}, "--rdzv-conf join_timeout: expected a number of seconds"},
           {{"--rdzv-backend", "zmq", "t.py"}, "--rdzv-backend: expected c10d, static, etcd or etcd-v2"},
           {{"--nproc-per-node", "many", "t.py"}, "--nproc-per-node: expected a positive number, cpu, gpu or auto"},
           {{"--start-method", "thread", "t.py"}, "--start-method: expected spawn, fork or forkserver"},
           {{"-m", "--no-python", "t"}, "-m, --no-python and --run-path exclude each other"},
           {{"--nproc-per-node", "2"}, "give the training script (or -m MODULE) and its arguments"},
           {{"--no-python", "/nonexistent/prog"}, "/nonexistent/prog"},
           // A flag torchrun does not have is a typo, not the script (nor the job's name).
           {{"--nproc-per-nodes", "2", "t.py"}, "unknown flag \"--nproc-per-nodes\"; did you mean --nproc-per-node?"},
           {{"--nproc_per_nodes=2", "t.py"}, "did you mean --nproc_per_node?"},
           {{"--bogus-flag", "t.py"}, "unknown flag \"--bogus-flag\"; the script (and its arguments) come after"},
           {{"--local-ranks-filter", "0", "t.py"},
            "trainctl does not take \"--local-ranks-filter\": every rank's output"},
       }) {
    std::vector<std::string> argv = {"torchrun"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = Trainctl(argv, s.path(""));
    EXPECT_EQ(r.exit.code, kExitInvalidSpec) << args[0] << "\n" << r.output;
    EXPECT_NE(r.output.find("trainctl torchrun: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  // Several hosts need the job's token, the same on each.
  auto r = Trainctl({"torchrun", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1",
                     "--rdzv-id", "x", "--no-python", "/bin/true"},
                    s.path(""), seconds(30), {{"TRAINCTL_TOKEN", ""}});
  EXPECT_EQ(r.exit.code, kExitInvalidSpec);
  EXPECT_NE(r.output.find("needs its token in TRAINCTL_TOKEN"), std::string::npos) << r.output;
}

// torch 2.x's --shutdown-timeout is the stop grace; --signals-to-handle takes trainctl's stop
// signals (torchrun's default list) and refuses any other by name.
TEST(Torchrun, TheShutdownTimeoutIsTheStopGraceAndOnlyStopSignalsAreHandled) {
  Scratch s;
  auto r = Trainctl({"torchrun", "--print-spec", "--shutdown-timeout", "2.5", "--signals-to-handle",
                     "SIGTERM,SIGINT,SIGHUP,SIGQUIT", "t.py"},
                    s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_NE(r.output.find("stop_grace: \"2500ms\""), std::string::npos) << r.output;
  r = Trainctl({"torchrun", "--signals_to_handle", "SIGTERM,SIGUSR1", "t.py"}, s.path(""));
  EXPECT_EQ(r.exit.code, kExitInvalidSpec) << r.output;
  EXPECT_NE(r.output.find("--signals-to-handle \"SIGUSR1\": trainctl stops the job"), std::string::npos) << r.output;
  r = Trainctl({"torchrun", "--shutdown-timeout", "soon", "t.py"}, s.path(""));
  EXPECT_EQ(r.exit.code, kExitInvalidSpec) << r.output;
  EXPECT_NE(r.output.find("--shutdown-timeout: expected a number of seconds, got \"soon\""), std::string::npos)
      << r.output;
}

// Every flag in the usage of the test's own torchrun (`torchrun --help` of TRAINCTL_TEST_PYTHON's
// torch: Debian's 1.13, or today's in the .torch2 variant) is one of trainctl torchrun's: taken,
// or refused with a line that names it, never called unknown or taken for the script.
TEST(Torchrun, EveryFlagOfTorchrunsHelpIsTakenOrRefusedByName) {
  Scratch s;
  auto help = RunProgram({TRAINCTL_TEST_PYTHON, "-m", "torch.distributed.run", "--help"}, s.path(""));
  ASSERT_EQ(help.exit.code, 0) << help.output;
  const std::string usage = help.output.substr(0, help.output.find("positional arguments"));
  auto dashed = [](std::string text) {
    std::replace(text.begin(), text.end(), '_', '-');
    return text;
  };
  // A value each flag can take (its first choice, when the usage lists them).
  const std::map<std::string, std::string> values = {{"--nnodes", "1"},
                                                     {"--nproc-per-node", "2"},
                                                     {"--rdzv-backend", "c10d"},
                                                     {"--rdzv-endpoint", "localhost:29400"},
                                                     {"--rdzv-id", "x"},
                                                     {"--rdzv-conf", "join_timeout=5"},
                                                     {"--max-restarts", "1"},
                                                     {"--monitor-interval", "0.1"},
                                                     {"--start-method", "spawn"},
                                                     {"--role", "default"},
                                                     {"--log-dir", s.path("logs")},
                                                     {"-r", "0"},
                                                     {"--redirects", "0"},
                                                     {"-t", "0"},
                                                     {"--tee", "0"},
                                                     {"--node-rank", "0"},
                                                     {"--master-addr", "127.0.0.1"},
                                                     {"--master-port", "29500"},
                                                     {"--local-addr", "127.0.0.1"},
                                                     {"--shutdown-timeout", "5"},
                                                     {"--signals-to-handle", "SIGTERM"}};
  const std::regex option(R"(\[(-{1,2}[A-Za-z][A-Za-z0-9_-]*)( ([A-Z_]+|\{([^,}]+)[^}]*\}))?\])");
  int flags = 0;
  for (std::sregex_iterator m(usage.begin(), usage.end(), option), end; m != end; ++m) {
    const std::string flag = (*m)[1];
    if (flag == "-h" || flag == "--help") continue;
    ++flags;
    std::vector<std::string> argv = {"torchrun", "--print-spec", flag};
    if ((*m)[2].matched) {
      const auto known = values.find(dashed(flag));
      argv.push_back((*m)[4].matched ? (*m)[4].str() : known != values.end() ? known->second : "1");
    }
    argv.push_back("t.py");
    auto r = Trainctl(argv, s.path(""));
    if (r.exit.code == 0) continue;
    EXPECT_EQ(r.exit.code, kExitInvalidSpec) << flag << "\n" << r.output;
    EXPECT_EQ(r.output.find("unknown flag"), std::string::npos) << flag << "\n" << r.output;
    EXPECT_NE(dashed(r.output).find(dashed(flag)), std::string::npos) << flag << " is not named:\n" << r.output;
  }
  EXPECT_GE(flags, 20) << usage;
}

// The help shows the script after the flags, as torchrun's usage does.
TEST(Torchrun, HelpShowsTheScriptAndItsArguments) {
  auto r = Trainctl({"torchrun", "--help"}, "/tmp");
  EXPECT_EQ(r.exit.code, 0) << r.output;
  EXPECT_NE(r.output.find("trainctl torchrun [OPTIONS] SCRIPT [ARGS...]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("SCRIPT [ARGS...]: the training script"), std::string::npos) << r.output;
}

// Without --log-dir, as torchrun without it: nothing is written into the working directory; the
// run's logs are in trainctl's state directory, where logs and ps find them.
TEST(Torchrun, WithoutLogDirTheWorkingDirectoryStaysClean) {
  Scratch s;
  ASSERT_TRUE(MakeDirs(s.path("cwd")).ok());
  const std::vector<std::pair<std::string, std::string>> env = {{"TRAINCTL_STATE_DIR", s.path("state")}};
  auto r = Trainctl({"torchrun", "--nproc-per-node", "2", "--no-python", "/bin/sh", "-c", "echo hi from $RANK"},
                    s.path("cwd"), seconds(60), env);
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::is_empty(s.path("cwd")));
  EXPECT_TRUE(Exists(s.path("state/torchrun/sh/logs/worker-1.log")));
  auto logs = Trainctl({"logs", "sh"}, s.path("cwd"), seconds(30), env);
  EXPECT_EQ(logs.exit.code, 0) << logs.output;
  EXPECT_NE(logs.output.find("[worker-1] hi from 1"), std::string::npos) << logs.output;
}

// An endpoint on IPv6's loopback keeps the job on loopback, as 127.0.0.1 and localhost do: the
// store listens on ::1 alone (not on every interface), a second command on this machine joins it
// there, and the workers' MASTER_ADDR is 127.0.0.1, not this machine's name or network address.
TEST(Torchrun, AnIpv6LoopbackEndpointKeepsTheJobOnLoopback) {
  Scratch s;
  const int port = FreePort();
  const std::vector<std::pair<std::string, std::string>> env = {{"TRAINCTL_TOKEN", "0123456789abcdef0123456789abcdef"},
                                                                {"TRAINCTL_STATE_DIR", s.path("state")}};
  const std::vector<std::string> argv = {"torchrun",
                                         "--nnodes",
                                         "2",
                                         "--nproc-per-node",
                                         "1",
                                         "--rdzv-backend",
                                         "c10d",
                                         "--rdzv-endpoint",
                                         "[::1]:" + std::to_string(port),
                                         "--rdzv-id",
                                         "v6",
                                         "--log-dir",
                                         s.path("out"),
                                         "--no-python",
                                         "/bin/sh",
                                         "-c",
                                         "echo \"master at $MASTER_ADDR\""};
  Background first(argv, s.path(""), s.path("first.log"), env);
  ASSERT_TRUE(Eventually([&] { return s.Read("first.log").find("serving the job's store") != std::string::npos; }))
      << s.Read("first.log");
  EXPECT_NE(s.Read("first.log").find("(on loopback only, with the job's token)"), std::string::npos)
      << s.Read("first.log");
  EXPECT_LT(ConnectOnce("127.0.0.1", static_cast<uint16_t>(port), Clock::now() + seconds(1)), 0)
      << "the store listens beyond ::1";
  auto second = Trainctl(argv, s.path(""), seconds(60), env);
  EXPECT_EQ(second.exit.code, 0) << second.output;
  EXPECT_NE(second.output.find("joining the job's store at [::1]:"), std::string::npos) << second.output;
  EXPECT_EQ(first.Wait(seconds(60)).code, 0) << s.Read("first.log");
  for (const char* log : {"out/logs/worker-0.log", "out/logs/worker-1.log"}) {
    EXPECT_NE(s.Read(log).find("master at 127.0.0.1\n"), std::string::npos) << log << ": " << s.Read(log);
  }
}

// One host: the workers get torchrun's environment (and the error file), output as with run.
TEST(Torchrun, OneHostRunsAsRunDoes) {
  Scratch s;
  auto r = Trainctl({"torchrun", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
                     s.path("out"), "--no-python", "/bin/sh", "-c",
                     "echo \"rank $RANK of $WORLD_SIZE local $LOCAL_RANK restarts $TORCHELASTIC_MAX_RESTARTS "
                     "errors ${TORCHELASTIC_ERROR_FILE##*/}\""},
                    s.path(""), seconds(60), {{"TRAINCTL_STATE_DIR", s.path("state")}});
  EXPECT_EQ(r.exit.code, 0) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string want = "rank " + std::to_string(rank) + " of 2 local " + std::to_string(rank) +
                             " restarts 1 errors worker-" + std::to_string(rank) + ".r0.t0.json";
    EXPECT_NE(r.output.find(want), std::string::npos) << r.output;
  }
  EXPECT_TRUE(Exists(s.path("out/logs/worker-1.log")));
}

// The same Python program under Debian's real torchrun and under trainctl torchrun: every variable
// torchrun sets, trainctl sets, with the same value except where docs/torchrun.md says why not.
TEST(Torchrun, WorkersGetEveryVariableTorchrunSets) {
  Scratch s;
  ASSERT_TRUE(MakeDirs(s.path("torchrun")).ok() && MakeDirs(s.path("trainctl")).ok());
  const std::string dump = std::string(TRAINCTL_SOURCE_DIR) + "/tests/python/env_dump.py";
  const std::vector<std::pair<std::string, std::string>> env = {{"PATH", "/usr/bin:/bin"},
                                                                {"TRAINCTL_STATE_DIR", s.path("state")}};
  // The underscore spellings, which Debian's torch 1.13 and today's both take; Python 3.11 needs
  // --redirects/--tee. TRAINCTL_TEST_PYTHON: Debian's torch, or PyPI's in the .torch2 build.
  SpawnOptions o;
  o.argv = {TRAINCTL_TEST_PYTHON,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "--redirects",
            "1",
            "--tee",
            "1",
            dump,
            s.path("torchrun")};
  o.env = CurrentEnvironment();
  for (const auto& [k, v] : env) SetEnv(&o.env, k, v);
  // Only what the launcher sets: none of these from this process.
  std::erase_if(o.env, [](const std::string& kv) {
    for (const char* name :
         {"OMP_NUM_THREADS=", "PYTHONUNBUFFERED=", "NCCL_ASYNC_ERROR_HANDLING=", "TORCH_NCCL_ASYNC_ERROR_HANDLING="}) {
      if (kv.rfind(name, 0) == 0) return true;
    }
    return false;
  });
  auto torchrun = RunCommand(o, seconds(120));
  ASSERT_TRUE(torchrun.ok() && torchrun->exit.code == 0)
      << (torchrun.ok() ? torchrun->output : torchrun.status().ToString());
  auto ours = Trainctl({"torchrun", "--python", TRAINCTL_TEST_PYTHON, "--standalone", "--nproc_per_node", "2",
                        "--redirects", "1", "--tee", "1", dump, s.path("trainctl")},
                       s.path(""), seconds(120), env);
  ASSERT_EQ(ours.exit.code, 0) << ours.output;
  // docs/torchrun.md says why these differ (torch 2.x's c10d sets TORCHELASTIC_USE_AGENT_STORE True).
  const std::set<std::string> differ = {"MASTER_ADDR",
                                        "MASTER_PORT",
                                        "ROLE_NAME",
                                        "TORCHELASTIC_RUN_ID",
                                        "TORCHELASTIC_ERROR_FILE",
                                        "TORCHELASTIC_USE_AGENT_STORE"};
  for (int rank = 0; rank < 2; ++rank) {
    auto theirs = nlohmann::json::parse(s.Read("torchrun/env-" + std::to_string(rank) + ".json"));
    auto mine = nlohmann::json::parse(s.Read("trainctl/env-" + std::to_string(rank) + ".json"));
    EXPECT_GE(theirs.size(), 15u) << theirs.dump(1);
    for (const auto& [name, value] : theirs.items()) {
      EXPECT_TRUE(mine.contains(name)) << name << " is not set by trainctl; torchrun sets it to " << value;
      if (mine.contains(name) && !differ.count(name)) {
        EXPECT_EQ(mine[name], value) << name;
      }
    }
    EXPECT_EQ(theirs["ROLE_NAME"], "default");
    EXPECT_EQ(mine["ROLE_NAME"], "worker");
  }
}

// A python3 first on PATH that lacks torch (a pyenv, a bare venv) is named before any worker
// starts, with the interpreter here that has torch; --python and TRAINCTL_PYTHON choose it.
TEST(Torchrun, APythonWithoutTorchIsNamedWithOneThatHasIt) {
  Scratch s;
  // A real interpreter without torch: Debian's, without its site-packages (as a bare venv is).
  const std::string bare = s.Write("bin/python3", "#!/bin/sh\nexec /usr/bin/python3 -S \"$@\"\n");
  ASSERT_EQ(::chmod(bare.c_str(), 0755), 0);
  const std::string script = s.Write("hi.py", "import os\nprint('rank', os.environ['RANK'], 'ran')\n");
  const Env env = {{"PATH", s.path("bin") + ":/usr/bin:/bin"}, {"TRAINCTL_STATE_DIR", s.path("state")}};
  auto r = Trainctl(
      {"torchrun", "--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--log-dir", s.path("out"), script},
      s.path(""), seconds(60), env);
  EXPECT_EQ(r.exit.code, kExitInvalidSpec) << r.output;
  EXPECT_NE(r.output.find("python3 from PATH (" + bare + ") cannot import torch"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/usr/bin/python3 has torch: run with --python /usr/bin/python3"), std::string::npos)
      << r.output;
  EXPECT_FALSE(Exists(s.path("out/logs"))) << "no worker started";
  for (const auto& [how, extra] : std::vector<std::pair<std::string, Env>>{
           {"--python", {}}, {"TRAINCTL_PYTHON", {{"TRAINCTL_PYTHON", "/usr/bin/python3"}}}}) {
    Env with = env;
    with.insert(with.end(), extra.begin(), extra.end());
    std::vector<std::string> argv = {"torchrun", "--standalone", "--nproc-per-node", "2"};
    if (how == "--python") argv.insert(argv.end(), {"--python", "/usr/bin/python3"});
    argv.push_back(script);
    auto ok = Trainctl(argv, s.path(""), seconds(60), with);
    EXPECT_EQ(ok.exit.code, 0) << how << "\n" << ok.output;
    EXPECT_NE(ok.output.find("rank 1 ran"), std::string::npos) << how << "\n" << ok.output;
  }
  auto wrong = Trainctl({"torchrun", "--python", bare, script}, s.path(""), seconds(60), env);
  EXPECT_EQ(wrong.exit.code, kExitInvalidSpec) << wrong.output;
  EXPECT_NE(wrong.output.find("--python " + bare + ": " + bare + " cannot import torch"), std::string::npos)
      << wrong.output;
}

// A module the script imports that is not installed fails the same way on every restart: the
// first start's import error ends the job at once (exit code 2), the restarts left unspent; an
// error later on restarts as ever.
TEST(Torchrun, AnImportErrorAtTheFirstStartSpendsNoRestart) {
  Scratch s;
  const Env env = {{"PATH", "/usr/bin:/bin"}, {"TRAINCTL_STATE_DIR", s.path("state")}};
  const std::string missing = s.Write("missing.py", "import os\nimport no_such_module_here\n");
  auto r = Trainctl(
      {"torchrun", "--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--log-dir", s.path("out"), missing},
      s.path(""), seconds(60), env);
  EXPECT_EQ(r.exit.code, kExitInvalidSpec) << r.output;
  EXPECT_NE(r.output.find("a restart would fail the same way, so none is spent"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ModuleNotFoundError: No module named 'no_such_module_here'"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restarting the worker group"), std::string::npos) << r.output;
  // The same error once the first start is past: restarts go on as for any other failure.
  const std::string later = s.Write("later.py",
                                    "import os\nif int(os.environ['TORCHELASTIC_RESTART_COUNT']) > 0:\n"
                                    "    import no_such_module_here\nraise SystemExit(1)\n");
  auto again = Trainctl(
      {"torchrun", "--standalone", "--nproc-per-node", "1", "--max-restarts", "2", "--log-dir", s.path("out2"), later},
      s.path(""), seconds(60), env);
  EXPECT_EQ(again.exit.code, kExitWorkerFailed) << again.output;
  EXPECT_NE(again.output.find("after 2 restart(s)"), std::string::npos) << again.output;
}

// Two `trainctl torchrun` commands, as two hosts would run them: one job of 2 nodes x 2 workers,
// its store served by the host of the endpoint, with a real gloo allreduce across all four.
TEST(Torchrun, TwoCommandsFormOneJobWithARealAllreduce) {
  Scratch s;
  const int port = FreePort();
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  const std::vector<std::pair<std::string, std::string>> env = {{"TRAINCTL_TOKEN", "0123456789abcdef0123456789abcdef"},
                                                                {"PATH", "/usr/bin:/bin"},
                                                                {"TRAINCTL_STATE_DIR", s.path("state")}};
  const std::vector<std::string> argv = {
      "torchrun",    "--nnodes",
      "2",           "--nproc_per_node",
      "2",           "--rdzv_backend",
      "c10d",        "--rdzv_endpoint",
      endpoint,      "--rdzv_id",
      "pair",        "--log_dir",
      s.path("out"), std::string(TRAINCTL_SOURCE_DIR) + "/tests/python/allreduce.py"};
  std::vector<std::string> first_argv = argv;
  Background first(first_argv, s.path(""), s.path("first.log"), env);
  ASSERT_TRUE(Eventually([&] {
    return s.Read("first.log").find("serving the job's store at " + endpoint) != std::string::npos;
  })) << s.Read("first.log");
  // It says so once the port is bound: the second command finds it taken and joins.
  const int fd = ConnectOnce("127.0.0.1", static_cast<uint16_t>(port), Clock::now() + seconds(1));
  EXPECT_GE(fd, 0) << "said it serves the store before its port was bound";
  if (fd >= 0) ::close(fd);
  auto second = Trainctl(argv, s.path(""), seconds(120), env);
  EXPECT_EQ(second.exit.code, 0) << second.output;
  EXPECT_NE(second.output.find("joining the job's store at " + endpoint), std::string::npos) << second.output;
  EXPECT_EQ(first.Wait(seconds(60)).code, 0) << s.Read("first.log");
  for (int rank = 0; rank < 4; ++rank) {
    auto result = nlohmann::json::parse(s.Read("out/result-" + std::to_string(rank) + ".json"));
    EXPECT_EQ(result["world"], 4);
    EXPECT_EQ(result["sum"], (std::vector<double>{10.0, 4.0}));
  }
}

// Each host's part of a job of several hosts is in `trainctl ps` there (target torchrun); `trainctl
// stop` ends it, the other host's part stops with it, and status.json says how it ended.
TEST(Torchrun, AJobOfSeveralHostsIsInPsAndStops) {
  Scratch s;
  const std::string endpoint = "127.0.0.1:" + std::to_string(FreePort());
  const std::vector<std::pair<std::string, std::string>> env = {{"TRAINCTL_TOKEN", "0123456789abcdef0123456789abcdef"},
                                                                {"TRAINCTL_STATE_DIR", s.path("state")}};
  const std::vector<std::string> argv = {"torchrun",
                                         "--nnodes",
                                         "2",
                                         "--nproc-per-node",
                                         "1",
                                         "--rdzv-backend",
                                         "c10d",
                                         "--rdzv-endpoint",
                                         endpoint,
                                         "--rdzv-id",
                                         "watch",
                                         "--log-dir",
                                         s.path("out"),
                                         "--no-python",
                                         "/bin/sh",
                                         "-c",
                                         "echo up; sleep 120"};
  Background first(argv, s.path(""), s.path("first.log"), env);
  ASSERT_TRUE(Eventually([&] { return s.Read("first.log").find("serving the job's store") != std::string::npos; }))
      << s.Read("first.log");
  Background second(argv, s.path(""), s.path("second.log"), env);
  for (const char* log : {"out/logs/worker-0.log", "out/logs/worker-1.log"}) {
    ASSERT_TRUE(Eventually([&] { return s.Read(log).find("up") != std::string::npos; })) << s.Read("second.log");
  }
  auto ps = Trainctl({"ps"}, s.path(""), seconds(30), env);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(ps.output, m, std::regex("(\\S+-watch) +running +2x1 "))) << ps.output;
  const std::string id = m[1];
  auto listed = nlohmann::json::parse(Trainctl({"ps", "--json"}, s.path(""), seconds(30), env).output);
  ASSERT_EQ(listed.size(), 1u) << listed;
  EXPECT_EQ(listed[0]["target"], "torchrun") << listed;
  auto stopped = Trainctl({"stop", id}, s.path(""), seconds(60), env);
  EXPECT_EQ(stopped.exit.code, 0) << stopped.output;
  EXPECT_EQ(first.Wait(seconds(30)).code, kExitInterrupted) << s.Read("first.log");
  EXPECT_EQ(second.Wait(seconds(30)).code, kExitInterrupted) << s.Read("second.log");
  auto status = nlohmann::json::parse(s.Read("out/status.json"));
  EXPECT_EQ(status["run_id"], id);
  EXPECT_EQ(status["state"], "interrupted") << status;
  EXPECT_TRUE(std::regex_search(Trainctl({"ps", "--all"}, s.path(""), seconds(30), env).output,
                                std::regex(id + " +interrupted ")));
}

// SIGTERM and Ctrl-C end the wait for the other hosts (the store served, no peer yet) at once, with
// exit 130 and nothing left behind, not after the rendezvous timeout (finding 6 of issue 49).
TEST(Torchrun, AStopSignalEndsTheWaitForPeers) {
  Scratch s;
  const std::string endpoint = "127.0.0.1:" + std::to_string(FreePort());
  const std::vector<std::pair<std::string, std::string>> env = {{"TRAINCTL_TOKEN", "0123456789abcdef0123456789abcdef"},
                                                                {"TRAINCTL_STATE_DIR", s.path("state")}};
  for (int sig : {SIGTERM, SIGINT}) {
    const std::string log = "alone-" + std::to_string(sig) + ".log";
    Background alone({"torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                      endpoint, "--rdzv-id", "alone", "--log-dir", s.path("out"), "--no-python", "/bin/true"},
                     s.path(""), s.path(log), env);
    ASSERT_TRUE(Eventually([&] { return s.Read(log).find("serving the job's store") != std::string::npos; }))
        << s.Read(log);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // into the rendezvous wait
    ::kill(alone.pid(), sig);
    EXPECT_EQ(alone.Wait(seconds(10)).code, kExitInterrupted) << s.Read(log);
    EXPECT_TRUE(ProcessesWithEnv({"TORCHELASTIC_RUN_ID=alone-alone"}).empty());
  }
}

// A host that joins a store nobody serves (yet), or a port held by something that is not a store
// (it accepts and says nothing), waits for it within the rendezvous timeout: SIGINT and SIGTERM
// end that wait within a second, with 130, leaving nothing (finding 4 of issue 65).
TEST(Torchrun, AStopSignalEndsTheWaitForTheStore) {
  Scratch s;
  const std::vector<std::pair<std::string, std::string>> env = {{"TRAINCTL_TOKEN", "0123456789abcdef0123456789abcdef"},
                                                                {"TRAINCTL_STATE_DIR", s.path("state")}};
  // A listener that never answers: connections complete in its backlog, the greeting waits.
  const int port_mute = FreePort();
  const int mute = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port_mute));
  ASSERT_EQ(::bind(mute, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(mute, 16), 0);
  for (const auto& [port, sig] :
       std::vector<std::pair<int, int>>{{FreePort(), SIGINT}, {FreePort(), SIGTERM}, {port_mute, SIGINT}}) {
    const std::string log = "joiner-" + std::to_string(port) + "-" + std::to_string(sig) + ".log";
    Background joiner({"torchrun", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--master-addr",
                       "127.0.0.1", "--master-port", std::to_string(port), "--rdzv-id", "joiner", "--log-dir",
                       s.path("out-" + log), "--no-python", "/bin/true"},
                      s.path(""), s.path(log), env);
    std::this_thread::sleep_for(std::chrono::seconds(2));  // into the wait for the store
    ASSERT_EQ(::waitpid(joiner.pid(), nullptr, WNOHANG), 0) << "it did not wait:\n" << s.Read(log);
    const auto signalled = Clock::now();
    ::kill(joiner.pid(), sig);
    EXPECT_EQ(joiner.Wait(seconds(10)).code, kExitInterrupted) << s.Read(log);
    EXPECT_LT(Clock::now() - signalled, std::chrono::milliseconds(1500)) << s.Read(log);
  }
  ::close(mute);
}

// The same for an agent a cluster engine starts (`agent --serve-store`, node 0 of 2, alone).
TEST(Torchrun, AStopSignalEndsAnAgentsWaitForItsPeers) {
  Scratch s;
  const std::string endpoint = "127.0.0.1:" + std::to_string(FreePort());
  s.Write("job.yaml", "name: waits\nnodes: 2\ncommand: ['true']\noutput_dir: " + s.path("out") + "\n");
  Background agent({"agent", "--run-id", "waits-1", "--node-rank", "0", "--serve-store", "--spec", s.path("job.yaml")},
                   s.path(""), s.path("agent.log"),
                   {{"TRAINCTL_AGENT_STORE", "tcp://" + endpoint}, {"TRAINCTL_AGENT_TOKEN", "0123456789abcdef0123"}});
  ASSERT_TRUE(Eventually([&] { return s.Read("agent.log").find("serving the job's store") != std::string::npos; }))
      << s.Read("agent.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // into the rendezvous wait
  ::kill(agent.pid(), SIGTERM);
  EXPECT_EQ(agent.Wait(seconds(10)).code, kExitInterrupted) << s.Read("agent.log");
}

// --rdzv-backend etcd: two commands meet on a real etcd (no store of trainctl's, no token).
TEST(Torchrun, TwoCommandsMeetOnEtcd) {
  const std::string endpoint = SharedEtcd().endpoints()[0];
  Scratch s;
  const std::vector<std::string> argv = {"torchrun",
                                         "--nnodes",
                                         "2",
                                         "--nproc-per-node",
                                         "1",
                                         "--rdzv-backend",
                                         "etcd",
                                         "--rdzv-endpoint",
                                         endpoint,
                                         "--rdzv-id",
                                         "on-etcd-" + std::to_string(FreePort()),
                                         "--log-dir",
                                         s.path("out"),
                                         "--no-python",
                                         "/bin/sh",
                                         "-c",
                                         "echo \"$RANK of $WORLD_SIZE\" >> " + s.path("ranks")};
  Background first(argv, s.path(""), s.path("first.log"), {{"TRAINCTL_STATE_DIR", s.path("state")}});
  auto second = Trainctl(argv, s.path(""), seconds(60), {{"TRAINCTL_STATE_DIR", s.path("state")}});
  EXPECT_EQ(second.exit.code, 0) << second.output;
  EXPECT_EQ(first.Wait(seconds(60)).code, 0) << s.Read("first.log");
  EXPECT_EQ(CountLines(s.Read("ranks"), "0 of 2"), 1) << s.Read("ranks");
  EXPECT_EQ(CountLines(s.Read("ranks"), "1 of 2"), 1) << s.Read("ranks");
}

}  // namespace
}  // namespace trainctl::testing
