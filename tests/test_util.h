// Helpers for integration tests: a scratch directory, writing job specs, running the real
// trainctl binary (to completion, or in the background to signal it), and checking processes.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "common/fs.h"
#include "common/subprocess.h"

namespace trainctl::testing {

namespace fs = std::filesystem;

class Scratch {
 public:
  Scratch() {
    dir_ = fs::temp_directory_path() / ("trainctl-it-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~Scratch() { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string Write(const std::string& name, const std::string& text) const {
    fs::create_directories(fs::path(path(name)).parent_path());
    std::ofstream(path(name)) << text;
    return path(name);
  }
  std::string Read(const std::string& name) const {
    auto r = ReadFile(path(name));
    return r.ok() ? *r : "";
  }

 private:
  static inline int counter_ = 0;
  fs::path dir_;
};

// Writes a spec (job.yaml) whose {out} is replaced by the scratch directory; returns its path.
inline std::string WriteSpec(const Scratch& s, const std::string& body, const std::string& name = "job.yaml") {
  std::string text = body;
  for (size_t pos; (pos = text.find("{out}")) != std::string::npos;) text.replace(pos, 5, s.path(""));
  return s.Write(name, text);
}

// The status.json a run left in the scratch directory's `out`.
inline nlohmann::json ReadStatus(const Scratch& s, const std::string& out = "out") {
  return nlohmann::json::parse(s.Read(out + "/status.json"));
}

// A loopback TCP port that was free a moment ago: drawn below the kernel's ephemeral range
// (32768 and up), so that no connection another test opens meanwhile takes it as its own end.
inline int FreePort() {
  static std::mt19937 random(std::random_device{}());
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = std::uniform_int_distribution<int>(20000, 32000)(random);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (free) return port;
  }
  ADD_FAILURE() << "no free port from 20000 to 32000";
  return 0;
}

// Runs any program to completion (its output, stdout and stderr, merged).
inline CommandResult RunProgram(const std::vector<std::string>& argv, const std::string& cwd,
                                Duration timeout = std::chrono::seconds(120)) {
  SpawnOptions o;
  o.argv = argv;
  o.env = CurrentEnvironment();
  o.cwd = cwd;
  auto r = RunCommand(o, timeout);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : CommandResult{};
}

inline CommandResult Trainctl(const std::vector<std::string>& args, const std::string& cwd,
                              Duration timeout = std::chrono::seconds(60),
                              const std::vector<std::pair<std::string, std::string>>& env = {}) {
  SpawnOptions o;
  o.argv = {TRAINCTL_BIN};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = CurrentEnvironment();
  for (const auto& [k, v] : env) SetEnv(&o.env, k, v);
  o.cwd = cwd;
  auto r = RunCommand(o, timeout);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->timed_out) << "trainctl did not finish in time; output:\n" << r->output;
  return r.ok() ? *r : CommandResult{};
}

// Polls `cond` until it holds or `timeout` passes; returns whether it held.
template <typename F>
bool Eventually(F cond, Duration timeout = std::chrono::seconds(30)) {
  auto deadline = Clock::now() + timeout;
  while (!cond()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// trainctl in the background, its output going to a file; `wrapper` runs it (setpriv ...).
// `trainctl render ARGS` run in `cwd`, the manifests alone (written with -o: warnings on stderr
// stay out of them) saved as `out` in the scratch directory; returns its path.
inline std::string RenderManifests(const Scratch& s, const std::string& out, std::vector<std::string> args,
                                   const std::string& cwd) {
  args.insert(args.begin(), "render");
  args.insert(args.end(), {"-o", s.path(out + ".d")});
  auto r = Trainctl(args, cwd);
  EXPECT_EQ(r.exit.code, 0) << r.output;
  std::string yaml;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(s.path(out + ".d"), ec)) yaml = *ReadFile(e.path().string());
  return s.Write(out, yaml);
}

class Background {
 public:
  Background(const std::vector<std::string>& args, const std::string& cwd, const std::string& log,
             const std::vector<std::pair<std::string, std::string>>& env = {},
             const std::vector<std::string>& wrapper = {})
      : log_(log) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    SpawnOptions o;
    o.argv = wrapper;
    o.argv.push_back(TRAINCTL_BIN);
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.env = CurrentEnvironment();
    for (const auto& [k, v] : env) SetEnv(&o.env, k, v);
    o.cwd = cwd;
    o.output_fd = fd;
    o.new_process_group = false;
    auto pid = Spawn(o);
    ::close(fd);
    EXPECT_TRUE(pid.ok()) << pid.status().ToString();
    pid_ = pid.ok() ? *pid : -1;
  }
  ~Background() {
    if (pid_ > 0 && !done_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  // Waits for exit; returns the exit info, or fails the test after `timeout`.
  ExitInfo Wait(Duration timeout) {
    int status = 0;
    if (!Eventually([&] { return ::waitpid(pid_, &status, WNOHANG) != 0; }, timeout)) {
      ADD_FAILURE() << "trainctl still running after " << timeout.count() << " ms";
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
    }
    done_ = true;
    return ExitInfo::FromWaitStatus(status);
  }
  std::string Output() const {
    auto r = ReadFile(log_);
    return r.ok() ? *r : "";
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool done_ = false;
};

// A process's state letter from /proc/<pid>/stat (R, S, T, Z, ...), or 0 when there is no such
// process.
inline char ProcessState(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return 0;
  std::string line;
  std::getline(stat, line);
  size_t close = line.rfind(')');  // the command name may hold spaces and parentheses
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : 0;
}

// A process is gone when /proc has no entry for it or it is a zombie (dead, awaiting its reaper).
inline bool ProcessGone(pid_t pid) {
  char state = ProcessState(pid);
  return state == 0 || state == 'Z';
}

// A process's NUL-separated /proc file (cmdline, environ) as strings; empty if it is gone.
inline std::vector<std::string> ProcStrings(pid_t pid, const char* file) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file, std::ios::binary);
  std::vector<std::string> out;
  for (std::string item; std::getline(in, item, '\0');) out.push_back(item);
  return out;
}

// The live processes for which `match(pid)` holds.
template <typename F>
std::vector<pid_t> LiveProcesses(F match) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t pid = std::stoi(name);
    if (match(pid) && !ProcessGone(pid)) out.push_back(pid);
  }
  return out;
}

// The live processes (of this user) whose environment holds every one of `vars` ("NAME=value").
inline std::vector<pid_t> ProcessesWithEnv(const std::vector<std::string>& vars) {
  return LiveProcesses([&](pid_t pid) {
    auto env = ProcStrings(pid, "environ");
    bool all = !env.empty();
    for (const auto& v : vars) all = all && std::find(env.begin(), env.end(), v) != env.end();
    return all;
  });
}

inline std::vector<pid_t> ReadPids(const std::string& file) {
  std::vector<pid_t> pids;
  std::ifstream in(file);
  pid_t p;
  while (in >> p) pids.push_back(p);
  return pids;
}

inline int CountLines(const std::string& text, const std::string& needle) {
  int n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find(needle) != std::string::npos) ++n;
  }
  return n;
}

}  // namespace trainctl::testing
