#include <unistd.h>

#include <filesystem>

#include "cli/verbs.h"
#include "data/dataset.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "launch/local/local_launcher.h"

namespace trainctl::cli {
namespace {

std::string Absolute(const std::string& path) {
  if (path.empty()) return path;
  return std::filesystem::absolute(path).lexically_normal().string();
}

}  // namespace

void AddRun(CLI::App& app, const GlobalFlags& flags, int* code) {
  auto* cmd = app.add_subcommand(
      "run", "Run a job on this machine: one agent per node, each starting its workers; worker "
             "output is shown as [worker-N] lines and saved under <output_dir>/logs");
  static SpecFlags spec_storage;
  SpecFlags* spec_flags = &spec_storage;
  spec_flags->Add(cmd);
  cmd->callback([spec_flags, &flags, code] {
    log::SetLevel(flags.log_level);
    auto spec = LoadOrReport(*spec_flags);
    if (!spec) {
      *code = kExitInvalidSpec;
      return;
    }
    spec->output_dir = Absolute(spec->output_dir);
    spec->checkpoint_dir = Absolute(spec->checkpoint_dir);
    spec->working_dir = Absolute(spec->working_dir);
    // A program that cannot start is a spec error, found now rather than as N worker crashes.
    std::vector<std::string> env = CurrentEnvironment();
    for (const auto& [k, v] : spec->env) SetEnv(&env, k, v);
    const std::string spec_file = spec_flags->Sources().files[0];
    if (spec->trainer.enabled) {
      const DataSpec& d = spec->trainer.data;
      std::string dir = d.dir.empty() ? data::kFashionMnistDir : d.dir;
      if (Status st = data::CheckDataDir(d.dataset, dir); !st.ok()) {
        std::fprintf(stderr, "%s: trainer.data: %s\n", spec_file.c_str(), st.message().c_str());
        *code = kExitInvalidSpec;
        return;
      }
    } else {
      std::string program = spec->command[0];
      if (program.find('/') != std::string::npos && program[0] != '/' && !spec->working_dir.empty()) {
        program = spec->working_dir + "/" + program;
      }
      if (auto found = FindExecutable(program, env); !found.ok()) {
        std::fprintf(stderr, "%s: command: %s\n", spec_file.c_str(), found.status().message().c_str());
        *code = kExitInvalidSpec;
        return;
      }
    }
    BlockSupervisorSignals();
    LaunchOptions options;
    options.self_exe = SelfExe();
    options.color_output = ::isatty(STDOUT_FILENO) != 0;
    options.log_level = flags.log_level;
    LocalLauncher launcher;
    *code = launcher.Run(*spec, options);
  });
}

}  // namespace trainctl::cli
