// A real S3 server for a test: `scripts/s3/s3 serve` (versitygw over a directory, which checks
// every request's SigV4 signature) on a free loopback port, with a directory, credentials and a
// bucket of its own. The script is the test's child (it gets SIGTERM when the test dies) and stops
// its server when it stops. scripts/dev test builds the server before the suite.
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "tests/test_util.h"

namespace trainctl::testing {

class S3Server {
 public:
  // Starts it in `dir` (made if missing), listening on `addr`; ok() says whether it answered
  // within a minute.
  explicit S3Server(const std::string& dir, const std::string& addr = "127.0.0.1") : dir_(dir) {
    fs::create_directories(dir);
    port_ = FreePort();
    SpawnOptions o;
    o.argv = {std::string(TRAINCTL_SOURCE_DIR) + "/scripts/s3/s3", "serve"};
    o.env = CurrentEnvironment();
    SetEnv(&o.env, "TRAINCTL_S3_DIR", dir + "/state");
    SetEnv(&o.env, "TRAINCTL_S3_PORT", std::to_string(port_));
    SetEnv(&o.env, "TRAINCTL_S3_ADDR", addr);
    SetEnv(&o.env, "TRAINCTL_S3_BUCKET", "trainctl");
    o.output_fd = ::open((dir + "/serve.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    auto pid = Spawn(o);
    ::close(o.output_fd);
    if (!pid.ok()) {
      log_ = pid.status().ToString();
      return;
    }
    pid_ = *pid;
    const std::string env_file = dir + "/state/env";
    ok_ = Eventually(
              [&] {
                return Log().find(env_file + "\n") != std::string::npos || ::waitpid(pid_, nullptr, WNOHANG) == pid_;
              },
              std::chrono::seconds(60)) &&
          Log().find(env_file + "\n") != std::string::npos;
    if (!ok_) return;
    auto text = ReadFile(env_file);
    std::istringstream lines(text.ok() ? *text : "");
    for (std::string line; std::getline(lines, line);) {
      const size_t eq = line.find('=');
      if (line.rfind("export ", 0) != 0 || eq == std::string::npos) continue;
      vars_.push_back({line.substr(7, eq - 7), line.substr(eq + 1)});
    }
  }
  ~S3Server() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    if (!Eventually([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, std::chrono::seconds(20))) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  bool ok() const { return ok_; }
  // What went wrong starting it (the script's output).
  std::string Log() const {
    auto r = ReadFile(dir_ + "/serve.log");
    return r.ok() ? *r : log_;
  }
  // AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION, TRAINCTL_S3_BUCKET.
  const std::vector<std::pair<std::string, std::string>>& Env() const { return vars_; }
  std::string Var(const std::string& key) const {
    for (const auto& [k, v] : vars_) {
      if (k == key) return v;
    }
    return "";
  }
  std::string endpoint() const { return Var("AWS_ENDPOINT_URL"); }
  std::string bucket() const { return Var("TRAINCTL_S3_BUCKET"); }

  struct Reply {
    int code = 0;      // the HTTP status; 0 when curl did not get one
    std::string body;  // the object, or S3's error document
  };
  // A request signed with the server's credentials (or `secret` in their place), as curl's own
  // SigV4 makes it: GET `path` ("bucket/key"), or PUT the file `upload` there.
  Reply Request(const std::string& path, const std::string& upload = "", const std::string& secret = "") const {
    const std::string config = dir_ + "/curl.conf";
    {
      const int fd = ::open(config.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      const std::string text = "user = \"" + Var("AWS_ACCESS_KEY_ID") + ":" +
                               (secret.empty() ? Var("AWS_SECRET_ACCESS_KEY") : secret) + "\"\n";
      if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) return {};
      ::close(fd);
    }
    const std::string body = dir_ + "/reply";
    std::vector<std::string> argv = {"curl",        "-sS",
                                     "-K",          config,
                                     "--aws-sigv4", "aws:amz:" + Var("AWS_REGION") + ":s3",
                                     "-H",          "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                                     "--max-time",  "30",
                                     "-o",          body,
                                     "-w",          "%{http_code}"};
    if (!upload.empty()) argv.insert(argv.end(), {"-T", upload});
    argv.push_back(endpoint() + "/" + path);
    auto r = RunProgram(argv, dir_, std::chrono::seconds(40));
    Reply reply;
    reply.code = std::atoi(r.output.c_str());
    auto text = ReadFile(body);
    reply.body = text.ok() ? *text : "";
    fs::remove(body);
    return reply;
  }

 private:
  std::string dir_, log_;
  int port_ = 0;
  pid_t pid_ = -1;
  bool ok_ = false;
  std::vector<std::pair<std::string, std::string>> vars_;
};

}  // namespace trainctl::testing
