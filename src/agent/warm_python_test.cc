#include "agent/warm_python.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace trainctl {
namespace {

TEST(WarmPython, InterpretersAreNamedPythonAndAVersion) {
  for (const char* yes : {"python", "python3", "python3.11", "/usr/bin/python3", "/opt/venv/bin/python"}) {
    EXPECT_TRUE(IsPythonInterpreter(yes)) << yes;
  }
  for (const char* no : {"python3-config", "pythonw.exe", "bash", "/usr/bin/torchrun", "ipython3", ""}) {
    EXPECT_FALSE(IsPythonInterpreter(no)) << no;
  }
}

TEST(WarmPython, TheInterpretersOptionsAreItsOwnAndTheWorkersCommandLineIsTheCopysArgument) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("warm-python-" + std::to_string(::getpid()));
  fs::create_directories(dir / "real");
  std::ofstream(dir / "real" / "train.py") << "print(1)\n";
  fs::create_symlink(dir / "real" / "train.py", dir / "link.py");

  auto plan = PlanWarmPython({"python3", "-u", "-X", "dev", "link.py", "a b", ""}, {"torch", "numpy"}, dir.string());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const auto& argv = plan->server_argv;
  ASSERT_EQ(argv.size(), 11u);
  EXPECT_EQ((std::vector<std::string>(argv.begin(), argv.begin() + 5)),
            (std::vector<std::string>{"python3", "-u", "-X", "dev", "-c"}));
  EXPECT_EQ(argv[5], kWarmPythonSource);
  EXPECT_EQ(argv[6], (dir / "real").string()) << "sys.path[0] is the script's real directory, as python's";
  EXPECT_EQ(argv[8], "3") << "the interpreter's options";
  EXPECT_EQ((std::vector<std::string>(argv.begin() + 9, argv.end())), (std::vector<std::string>{"torch", "numpy"}));
  EXPECT_EQ(plan->argument, "7:python32:-u2:-X3:dev7:link.py3:a b0:");

  plan = PlanWarmPython({"/usr/bin/python3", "-B", "-m", "pkg.main", "--lr", "1"}, {"torch"}, dir.string());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->server_argv[4], dir.string()) << "-m: sys.path[0] is the working directory";
  EXPECT_EQ(plan->server_argv[6], "1");

  for (const auto& [command, why] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"python3", "-c", "print(1)"}, "option -c"},
           {{"python3", "-i", "link.py"}, "option -i"},
           {{"python3", "-x", "link.py"}, "option -x"},
           {{"python3", "-"}, "standard input"},
           {{"python3", "-u"}, "no script"},
           {{"python3", "-m"}, "names no module"},
           {{"python3", "missing.py"}, "missing.py is not a file"},
           {{"python3", "real"}, "real is not a file"},
           {{"bash", "run.sh"}, "not a Python interpreter"}}) {
    auto refused = PlanWarmPython(command, {"torch"}, dir.string());
    ASSERT_FALSE(refused.ok()) << command[1];
    EXPECT_NE(refused.status().message().find(why), std::string::npos) << refused.status().message();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace trainctl
