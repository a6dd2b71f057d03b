// trainctl: one binary, one YAML job spec. See docs/cli.md.
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <new>

#include "cli/verbs.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/strings.h"

namespace {

// Help ends with docs; the verbs that run a job, with their exit codes.
constexpr const char* kDocs = "Run 'trainctl VERB --help' for a verb's flags. Docs: docs/job-spec.md, docs/cli.md.";

// The first word that is not a global flag (the verb, if the command line is right), or "".
std::string VerbWord(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--log-level") {
      ++i;  // its value
      continue;
    }
    if (arg == "--") return "";
    if (!arg.empty() && arg[0] == '-') continue;
    return arg;
  }
  return "";
}

// The verb word must be a verb: a typo gets a did-you-mean and the list of verbs, not CLI11's
// "A subcommand is required". Returns false after printing the error.
bool CheckVerb(const CLI::App& app, const std::string& word) {
  if (word.empty()) return true;
  std::vector<std::string> verbs;
  for (const auto* sub : app.get_subcommands({})) verbs.push_back(sub->get_name());
  if (std::find(verbs.begin(), verbs.end(), word) != verbs.end()) return true;
  const std::string near = trainctl::ClosestMatch(word, verbs);
  std::fprintf(stderr, "trainctl: unknown verb %s%s\nverbs: %s\nRun 'trainctl --help' for what each does.\n",
               trainctl::Quote(word).c_str(), near.empty() ? "" : ("; did you mean '" + near + "'?").c_str(),
               trainctl::Join(verbs, ", ").c_str());
  return false;
}

// `trainctl logs -f JOB` and `logs JOB -f`, as kubectl and tail spell them: a -f that is not
// followed by a spec file (a layer, as for run) is --follow.
void FollowFlag(std::vector<std::string>& args) {
  auto verb = std::find(args.begin() + 1, args.end(), "logs");
  if (verb == args.end()) return;
  for (auto it = verb + 1; it != args.end(); ++it) {
    if (*it != "-f") continue;
    struct stat st {};
    const bool file = it + 1 != args.end() && ::stat((it + 1)->c_str(), &st) == 0 && S_ISREG(st.st_mode);
    if (!file) *it = "--follow";
  }
}

// CLI11's "The following arguments were not expected", with the flag each unknown one is nearest
// to (`--sett a=b`: did you mean --set?).
int UnexpectedArguments(CLI::App& app) {
  CLI::App* at = &app;
  while (!at->get_subcommands().empty()) at = at->get_subcommands()[0];
  std::vector<std::string> extras = at->remaining();
  if (at != &app) {
    for (const auto& a : app.remaining()) extras.push_back(a);
  }
  const std::string who = at == &app ? "trainctl" : "trainctl " + at->get_name();
  bool flagged = false;
  for (const auto& arg : extras) {
    if (arg.size() < 2 || arg[0] != '-') continue;
    const std::string near = trainctl::cli::NearestFlag(*at, arg);
    std::fprintf(stderr, "%s: unknown flag %s%s\n", who.c_str(), trainctl::Quote(arg).c_str(),
                 near.empty() ? "" : ("; did you mean " + near + "?").c_str());
    flagged = true;
  }
  if (!flagged) {
    std::fprintf(stderr, "%s: unexpected argument%s: %s\n", who.c_str(), extras.size() > 1 ? "s" : "",
                 trainctl::Join(extras, " ").c_str());
  }
  std::fprintf(stderr, "Run '%s --help' for its flags.\n", who.c_str());
  return trainctl::kExitInvalidSpec;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "trainctl runs distributed training jobs from one YAML job spec: on this machine "
      "by default (N worker processes supervised by an agent), restarting failed "
      "workers, with the environment torchrun gives, so PyTorch scripts run unchanged.",
      "trainctl"};
  app.footer(std::string(trainctl::kExitCodesHelp) + "\n\n" + kDocs);
  app.require_subcommand(1);
  // Global flags also after the verb (`trainctl run job.yaml --log-level debug`); every verb
  // inherits this from the app.
  app.fallthrough();
  app.set_version_flag("--version", TRAINCTL_VERSION);
  trainctl::cli::GlobalFlags flags;
  flags.argc = argc;
  flags.argv = argv;
  app.add_option("--log-level", flags.log_level, "trace, debug, info, warn or error")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  int code = trainctl::kExitOk;
  const std::string verb = VerbWord(argc, argv);
  using namespace trainctl::cli;
  using AddVerbs = void (*)(CLI::App&, const GlobalFlags&, int*);
  for (AddVerbs add : {AddRun, AddValidate, AddSchema, AddAgent, AddTrain, AddEval, AddPredict, AddTorchrun, AddBench,
                       AddRender, AddPipeline, AddClusterVerbs, AddLocalJobVerbs}) {
    // An agent is started once per node (a 1024-node job starts 1024): it builds only its own
    // flags, not every verb's (a third of a process start).
    if (verb == "agent" && add != AddAgent) continue;
    add(app, flags, &code);
  }
  // Each verb's help: its exit codes where it runs a job (torchrun writes its own), else the docs.
  for (auto* sub : app.get_subcommands({})) {
    const std::string n = sub->get_name();
    if (n == "torchrun") continue;
    sub->footer(n == "run" || n == "agent" ? std::string(trainctl::kExitCodesHelp) : "Docs: docs/cli.md");
  }
  if (argc == 1) {  // plain `trainctl`: what it does and its verbs, as docker and kubectl answer
    std::fputs(app.help().c_str(), stdout);
    return trainctl::kExitOk;
  }
  if (!CheckVerb(app, verb)) return trainctl::kExitInvalidSpec;
  std::vector<std::string> args(argv, argv + argc);
  FollowFlag(args);
  std::vector<std::string> reversed(args.rbegin(), args.rend() - 1);  // CLI11 takes them reversed
  try {
    app.parse(reversed);
  } catch (const CLI::ExtrasError& e) {
    return UnexpectedArguments(app);
  } catch (const std::bad_alloc&) {  // a message, never SIGABRT (issue 49)
    std::fprintf(stderr, "trainctl %s: out of memory\n", verb.c_str());
    return trainctl::kExitError;
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? trainctl::kExitOk : trainctl::kExitInvalidSpec;
  }
  return code;
}
