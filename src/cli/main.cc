// trainctl: one binary, one YAML job spec. See docs/cli.md.
#include <CLI/CLI.hpp>

#include "cli/verbs.h"
#include "common/exit_codes.h"
#include "common/log.h"

namespace {

const char* kFooter = R"(Exit codes:
  0    the job succeeded (validate: the spec is valid)
  1    trainctl itself failed (I/O error, lost the job's store)
  2    invalid job spec or command line
  3    a worker failed and the restart budget (restart.max_restarts) is spent
  4    rendezvous timed out: not every node joined within timeouts.rendezvous
  5    the job ran longer than timeouts.job
  130  interrupted (Ctrl-C, SIGTERM or SIGHUP); everything trainctl started is stopped

Run 'trainctl VERB --help' for a verb's flags. Docs: docs/job-spec.md, docs/cli.md.)";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trainctl runs distributed training jobs from one YAML job spec: on this machine "
               "by default (N worker processes supervised by an agent), restarting failed "
               "workers, with the environment torchrun gives, so PyTorch scripts run unchanged.",
               "trainctl"};
  app.footer(kFooter);
  app.require_subcommand(1);
  app.set_version_flag("--version", TRAINCTL_VERSION);
  trainctl::cli::GlobalFlags flags;
  app.add_option("--log-level", flags.log_level, "trace, debug, info, warn or error")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  int code = trainctl::kExitOk;
  trainctl::cli::AddRun(app, flags, &code);
  trainctl::cli::AddValidate(app, flags, &code);
  trainctl::cli::AddAgent(app, flags, &code);
  trainctl::cli::AddTrain(app, flags, &code);
  trainctl::cli::AddEval(app, flags, &code);
  trainctl::cli::AddRender(app, flags, &code);
  trainctl::cli::AddClusterVerbs(app, flags, &code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? trainctl::kExitOk : trainctl::kExitInvalidSpec;
  }
  return code;
}
