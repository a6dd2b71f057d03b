#include <cstdio>
#include <filesystem>

#include "cli/verbs.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "data/dataset.h"
#include "data/file_list.h"

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
  cmd->add_option("--set", sets,
                  "override one field: --set restart.max_restarts=5, "
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

// "data: DIR: 1281167 training and 50000 test images in 1000 classes (list: from the cache, 0.8 s)":
// from the listing a run reads (and keeps: data/file_list.h).
Result<std::string> DescribeFolder(const DataSpec& d) {
  data::ListOptions lo;
  lo.cache_dir = data::DefaultListCacheDir();
  lo.threads = 8;
  lo.holdout = d.test_dir.empty() ? d.holdout : 0;
  data::ListReport report;
  auto train = data::ListImageFolder(d.dir, lo, &report);
  if (!train.ok()) return train.status();
  int64_t tests = 0;
  if (!d.test_dir.empty()) {
    data::ListOptions to = lo;
    to.classes = train->classes();
    auto test = data::ListImageFolder(d.test_dir, to);
    if (!test.ok()) return test.status();
    tests = test->size();
  } else if (d.holdout > 0) {
    lo.test = true;
    auto held = data::ListImageFolder(d.dir, lo);
    tests = held.ok() ? held->size() : 0;
  }
  char line[512];
  std::snprintf(line, sizeof line, "data: %s: %lld training and %lld test images in %zu classes (list: %s, %.2f s)",
                d.dir.c_str(), static_cast<long long>(train->size()), static_cast<long long>(tests),
                train->classes().size(), report.from_cache ? "from the cache" : "made", report.seconds);
  if (!report.cache_refused.empty()) return line + std::string("\n  the list cache not used: ") + report.cache_refused;
  return std::string(line);
}

void AddValidate(CLI::App& app, const GlobalFlags& flags, int* code) {
  auto* cmd =
      app.add_subcommand("validate", "Check a job spec (and its layers and overrides) without running anything");
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
    std::string shape_note;
    if (!*fields_only) {
      ResolveProgramPaths(&*spec, ProgramBase(*spec, spec_file));
      auto shape = ResolveFolderShape(&*spec);
      if (!shape.ok()) {
        std::fprintf(stderr, "%s: trainer.data: %s\n", spec_file.c_str(), shape.status().message().c_str());
        *code = kExitInvalidSpec;
        return;
      }
      shape_note = *shape;
    }
    if (Status st = *fields_only ? Status::Ok() : Preflight(*spec, spec_file, spec_flags->sets); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.message().c_str());
      *code = kExitInvalidSpec;
      return;
    }
    // A TorchScript module is loaded and run on a batch of the data's images, as a worker would
    // before training: a pickle saved with torch.save, a state_dict, the wrong number of scores
    // or of channels are refused here, not at run.
    const TrainerSpec& t = spec->trainer;
    int classes = ClassCount(t.data);
    if (t.enabled && t.data.dataset == "imagefolder" && !*fields_only) {  // its class folders, checked above
      if (auto folders = data::FolderClasses(t.data.dir); folders.ok()) classes = static_cast<int>(folders->size());
    }
    std::string module;
    if (t.enabled && t.model == "torchscript" && !*fields_only) {
      auto checked = CheckScriptedModel(t.torchscript, ImageShape(t.data), classes);
      if (!checked.ok()) {
        std::fprintf(stderr, "%s: trainer.model.torchscript: %s\n", spec_file.c_str(),
                     checked.status().message().c_str());
        *code = kExitInvalidSpec;
        return;
      }
      module = "model: the TorchScript module " + t.torchscript + ": " + *checked;
    }
    // The folders listed as a worker lists them (an empty class folder, a test class training
    // lacks), before the spec is called valid: with a shape given, nothing above listed them.
    std::string folder;
    if (t.enabled && t.data.dataset == "imagefolder" && !*fields_only) {
      auto described = DescribeFolder(t.data);
      if (!described.ok()) {
        std::fprintf(stderr, "%s: trainer.data: %s\n", spec_file.c_str(), described.status().message().c_str());
        *code = kExitInvalidSpec;
        return;
      }
      folder = *described;
    }
    if (*print) {
      std::printf("%s\n", JobSpecToJson(*spec, 2).c_str());
    } else {
      std::printf("%s: valid: job %s, %s\n", Join(spec_flags->Sources().files, " + ").c_str(), spec->name.c_str(),
                  DescribeTasks(*spec).c_str());
      if (!folder.empty()) std::printf("%s\n", folder.c_str());
      if (!shape_note.empty()) std::printf("%s\n", shape_note.c_str());
      if (!module.empty()) std::printf("%s\n", module.c_str());
      // The model's layer table (declared, or a built-in one's layers), as Keras's summary() prints it.
      const auto layers =
          t.model == "layers" ? std::optional<std::vector<LayerSpec>>(t.layers) : BuiltinLayers(t.model);
      if (t.enabled && layers && !ImageShape(t.data).empty()) {
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
  auto* cmd =
      app.add_subcommand("schema",
                         "Print the job spec's JSON Schema (for editors: add the line "
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
