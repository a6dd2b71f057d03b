#include "agent/warm_python.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>

#include "common/strings.h"

namespace trainctl {

bool IsPythonInterpreter(const std::string& program) {
  const std::string exe = std::filesystem::path(program).filename().string();
  if (exe.rfind("python", 0) != 0) return false;
  // python, python3, python3.11: nothing after the name but a version.
  for (size_t i = 6; i < exe.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(exe[i])) && exe[i] != '.') return false;
  }
  return true;
}

Result<WarmPythonPlan> PlanWarmPython(const std::vector<std::string>& argv, const std::vector<std::string>& preload,
                                      const std::string& cwd) {
  const std::string shown = Join(argv, " ");
  if (argv.empty() || !IsPythonInterpreter(argv[0])) return InvalidArgument(shown + " is not a Python interpreter");
  auto cannot = [&](const std::string& why) {
    return InvalidArgument("a warm interpreter cannot run `" + shown + "` as python would: " + why);
  };
  // The interpreter's options before the script: those a copy honours as a fresh interpreter
  // would (they are the warm interpreter's own), -W/-X/--check-hash-based-pycs with their values.
  size_t i = 1;
  bool module = false;
  for (; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.empty() || a[0] != '-' || a == "-") break;
    if (a == "-m") {
      module = true;
      break;
    }
    if (a == "--check-hash-based-pycs" || a == "-W" || a == "-X") {
      ++i;
      continue;
    }
    if (a[1] == 'W' || a[1] == 'X') continue;  // -Wignore, -Xdev
    if (a.find_first_not_of("bBdEIOPqsSuv", 1) != std::string::npos) {
      return cannot("option " + a + " (a warm interpreter takes -bBdEIOPqsSuv, -W, -X and -m MODULE)");
    }
  }
  if (i >= argv.size()) return cannot("no script to run");
  if (argv[i] == "-") return cannot("the script comes from standard input");
  const size_t flags = i - 1;
  std::string path0;  // what a fresh interpreter puts first in sys.path
  std::error_code ec;
  const std::string dir = cwd.empty() ? std::filesystem::current_path(ec).string() : cwd;
  if (module) {
    if (i + 1 >= argv.size()) return cannot("-m names no module");
    path0 = dir;
  } else {
    const std::string& script = argv[i];
    const std::string at = script[0] == '/' ? script : dir + "/" + script;
    char real[PATH_MAX];
    struct stat st;
    if (!::realpath(at.c_str(), real) || ::stat(real, &st) != 0 || !S_ISREG(st.st_mode)) {
      return cannot(script + " is not a file (the interpreter itself says why)");
    }
    if (script.ends_with(".pyc")) return cannot(script + " is compiled bytecode, not source");
    path0 = std::filesystem::path(real).parent_path().string();
  }
  WarmPythonPlan plan;
  plan.server_argv.assign(argv.begin(), argv.begin() + static_cast<long>(i));
  plan.server_argv.insert(plan.server_argv.end(),
                          {"-c", kWarmPythonSource, path0, std::to_string(SYS_clone) + "," + std::to_string(SYS_brk),
                           std::to_string(flags)});
  plan.server_argv.insert(plan.server_argv.end(), preload.begin(), preload.end());
  for (const auto& a : argv) plan.argument += std::to_string(a.size()) + ":" + a;
  return plan;
}

}  // namespace trainctl
