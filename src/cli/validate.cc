#include <cstdio>
#include <filesystem>

#include "cli/verbs.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "data/dataset.h"

namespace trainctl::cli {

int Fail(const std::string& verb, const Status& st) {
  std::fprintf(stderr, "trainctl %s: %s\n", verb.c_str(), st.message().c_str());
  return st.code() == Code::kNotFound || st.code() == Code::kInvalidArgument ? kExitInvalidSpec : kExitError;
}

void SpecFlags::Add(CLI::App* cmd, const std::string& name, const std::string& what) {
  cmd->add_option(name, file, what);
  cmd->add_option("-f,--file", files,
                  "more spec files, layered in order over the first (maps merge, the rest "
                  "replaces, null deletes)")
      ->allow_extra_args(false);
  cmd->add_option("--set", sets, "override one field: --set restart.max_restarts=5, "
                                 "--set args[0]=--fast, --set 'command=[python3, t.py]'")
      ->allow_extra_args(false);
}

SpecSources SpecFlags::Sources() const {
  SpecSources s;
  if (!file.empty()) s.files.push_back(file);
  s.files.insert(s.files.end(), files.begin(), files.end());
  s.sets = sets;
  return s;
}

std::string NearestFlag(const CLI::App& cmd, const std::string& arg) {
  const std::string word = arg.substr(0, arg.find('='));
  std::vector<std::string> flags;
  for (const CLI::App* at = &cmd; at != nullptr; at = at->get_parent()) {
    for (const CLI::Option* o : at->get_options()) {
      for (const auto& l : o->get_lnames()) flags.push_back("--" + l);
      for (const auto& s : o->get_snames()) flags.push_back("-" + s);
    }
  }
  return ClosestMatch(word, flags);
}

std::string AbsolutePath(const std::string& path) {
  if (path.empty()) return path;
  return std::filesystem::absolute(path).lexically_normal().string();
}

std::optional<JobSpec> LoadOrReport(const SpecFlags& flags) {
  auto spec = LoadJobSpec(flags.Sources());
  if (!spec.ok()) {
    for (const auto& line : SplitLines(spec.status().message())) {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    return std::nullopt;
  }
  return *spec;
}

void AddValidate(CLI::App& app, const GlobalFlags& flags, int* code) {
  auto* cmd = app.add_subcommand(
      "validate", "Check a job spec (and its layers and overrides) without running anything");
  static SpecFlags spec_storage;
  SpecFlags* spec_flags = &spec_storage;
  spec_flags->Add(cmd);
  static bool print_storage = false;
  bool* print = &print_storage;
  cmd->add_flag("--print", *print, "print the resolved spec, with defaults filled in, as JSON");
  static bool fields_only_storage = false;
  bool* fields_only = &fields_only_storage;
  cmd->add_flag("--fields-only", *fields_only,
                "check the spec's fields only, not the datasets, programs and devices it names (for a spec "
                "that runs elsewhere, as in a cluster's pods)");
  cmd->callback([spec_flags, print, fields_only, code] {
    auto spec = LoadOrReport(*spec_flags);
    if (!spec) {
      *code = kExitInvalidSpec;
      return;
    }
    const std::string spec_file = spec_flags->Sources().files[0];
    if (!*fields_only) ResolveProgramPaths(&*spec, ProgramBase(*spec, spec_file));
    if (Status st = *fields_only ? Status::Ok() : Preflight(*spec, spec_file, spec_flags->sets); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.message().c_str());
      *code = kExitInvalidSpec;
      return;
    }
    if (*print) {
      std::printf("%s\n", JobSpecToJson(*spec, 2).c_str());
    } else {
      std::printf("%s: valid: job %s, %s\n", Join(spec_flags->Sources().files, " + ").c_str(),
                  spec->name.c_str(), DescribeTasks(*spec).c_str());
      // The model's layer table (declared, or a built-in one's layers), as Keras's summary() prints it.
      const TrainerSpec& t = spec->trainer;
      const auto layers = t.model == "layers" ? std::optional<std::vector<LayerSpec>>(t.layers) : BuiltinLayers(t.model);
      if (t.enabled && layers) {
        int classes = ClassCount(t.data);
        if (t.data.dataset == "imagefolder" && !*fields_only) {  // its class folders, checked above
          auto folders = data::FolderClasses(t.data.dir);
          if (folders.ok()) classes = static_cast<int>(folders->size());
        }
        auto summary = SummarizeModel(*layers, ImageShape(t.data), classes);
        if (!summary.ok()) {
          std::fprintf(stderr, "%s\n", summary.status().message().c_str());
          *code = kExitInvalidSpec;
          return;
        }
        std::printf("model: %s images in, %d classes out\n%s", ShapeText(ImageShape(t.data)).c_str(), classes,
                    FormatSummary(*summary).c_str());
      }
    }
    *code = kExitOk;
  });
}

void AddSchema(CLI::App& app, const GlobalFlags& flags, int* code) {
  auto* cmd = app.add_subcommand(
      "schema", "Print the job spec's JSON Schema (for editors: add the line "
                "'# yaml-language-server: $schema=FILE' to a spec; Helm charts use it as values.schema.json)");
  static std::string output;
  cmd->add_option("-o,--output", output, "write it to this file instead of standard output");
  cmd->callback([&flags, code] {
    log::SetLevel(flags.log_level);
    const std::string schema = JobSpecSchema(2);
    if (output.empty()) {
      std::fputs(schema.c_str(), stdout);
      *code = kExitOk;
    } else {
      Status st = AtomicWriteFile(output, schema);
      *code = st.ok() ? kExitOk : Fail("schema", st);
    }
  });
}

}  // namespace trainctl::cli
