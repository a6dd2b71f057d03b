#include <cstdio>
#include <filesystem>

#include "cli/verbs.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/strings.h"
#include "launch/k8s/render.h"
#include "launch/slurm/sbatch.h"

namespace trainctl::cli {

namespace {

// Writes every file under `dir`, each atomically; stops at the first failure.
Status WriteTree(const std::string& dir, const std::map<std::string, std::string>& files) {
  for (const auto& [path, text] : files) {
    const std::string full = dir + "/" + path;
    RETURN_IF_ERROR(MakeDirs(std::filesystem::path(full).parent_path().string()));
    RETURN_IF_ERROR(AtomicWriteFile(full, text));
  }
  return Status::Ok();
}

}  // namespace

void AddRender(CLI::App& app, const GlobalFlags& flags, int* code) {
  auto* cmd = app.add_subcommand(
      "render", "Write what runs the job on a cluster engine: Kubernetes manifests (an Indexed "
                "Job, or the Kubeflow PyTorchJob kind), a kustomize base with one overlay per "
                "environment, or a Slurm batch script. Nothing is contacted; see docs/cluster.md");
  struct Flags {
    SpecFlags spec;
    std::string target = "k8s";
    std::string format = "job";
    std::vector<std::string> envs;
    std::string out;
    std::string trainctl = "trainctl";
  };
  static Flags storage;
  Flags* f = &storage;
  f->spec.Add(cmd);
  cmd->add_option("--target", f->target, "the cluster engine")
      ->capture_default_str()
      ->check(CLI::IsMember({"k8s", "slurm"}));
  std::vector<std::string> formats = k8s::kFormats;
  formats.push_back("kustomize");
  cmd->add_option("--format", f->format,
                  "k8s: job (Indexed Jobs, no operator; one per role for jobs with roles), "
                  "pytorchjob or tfjob (Kubeflow Training Operator), mpijob (MPI Operator v2beta1), "
                  "trainjob (Kubeflow Trainer v2), kustomize (a base plus overlays, see --env; needs -o)")
      ->capture_default_str()
      ->check(CLI::IsMember(formats));
  cmd->add_option("--env", f->envs,
                  "kustomize: an overlay, NAME=FILE[,FILE...]: the spec layered with these files")
      ->allow_extra_args(false);
  cmd->add_option("-o,--output", f->out, "a directory to write into (default: stdout)");
  cmd->add_option("--trainctl", f->trainctl, "slurm: the trainctl binary as the nodes see it")
      ->capture_default_str();
  cmd->callback([f, code] {
    auto spec = LoadOrReport(f->spec);
    if (!spec) {
      *code = kExitInvalidSpec;
      return;
    }
    if (f->target == "slurm") {
      // The script runs the same spec sources, from the shared filesystem.
      std::vector<std::string> args;
      for (size_t i = 0; i < f->spec.Sources().files.size(); ++i) {
        if (i > 0) args.push_back("-f");
        args.push_back(AbsolutePath(f->spec.Sources().files[i]));
      }
      for (const auto& set : f->spec.sets) args.insert(args.end(), {"--set", set});
      const std::string script = slurm::SbatchScript(*spec, args, f->trainctl);
      if (f->out.empty()) {
        std::fputs(script.c_str(), stdout);
        return;
      }
      const std::string path = f->out + "/" + spec->name + ".sbatch";
      Status st = MakeDirs(f->out);
      if (st.ok()) st = AtomicWriteFile(path, script, 0755);
      if (!st.ok()) {
        std::fprintf(stderr, "trainctl render: %s\n", st.message().c_str());
        *code = kExitError;
        return;
      }
      std::printf("wrote %s; submit it with sbatch %s\n", path.c_str(), path.c_str());
      return;
    }
    if (Status st = k8s::CheckFormat(*spec, f->format == "kustomize" ? "job" : f->format); !st.ok()) {
      std::fprintf(stderr, "%s: %s\n", f->spec.Sources().files[0].c_str(), st.message().c_str());
      *code = kExitInvalidSpec;
      return;
    }
    if (f->format != "kustomize") {
      if (!f->envs.empty()) {
        std::fprintf(stderr, "trainctl render: --env goes with --format kustomize\n");
        *code = kExitInvalidSpec;
        return;
      }
      const std::string yaml = k8s::ToYaml(k8s::Render(*spec, f->format));
      if (f->out.empty()) {
        std::fputs(yaml.c_str(), stdout);
        return;
      }
      if (Status st = WriteTree(f->out, {{spec->name + ".yaml", yaml}}); !st.ok()) {
        std::fprintf(stderr, "trainctl render: %s\n", st.message().c_str());
        *code = kExitError;
        return;
      }
      std::printf("wrote %s/%s.yaml\n", f->out.c_str(), spec->name.c_str());
      return;
    }
    if (f->out.empty()) {
      std::fprintf(stderr, "trainctl render: --format kustomize writes a directory tree; give it with -o DIR\n");
      *code = kExitInvalidSpec;
      return;
    }
    std::vector<std::pair<std::string, JobSpec>> envs;
    for (const auto& e : f->envs) {
      auto eq = e.find('=');
      const std::string name = e.substr(0, eq);
      if (eq == std::string::npos || name.empty() || eq + 1 == e.size() ||
          name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-_") != std::string::npos) {
        std::fprintf(stderr, "trainctl render: --env %s: expected NAME=FILE[,FILE...], NAME in "
                             "lowercase letters, digits, '-' and '_'\n", e.c_str());
        *code = kExitInvalidSpec;
        return;
      }
      SpecFlags layered = f->spec;
      for (const auto& file : Split(e.substr(eq + 1), ',')) layered.files.push_back(file);
      auto env_spec = LoadOrReport(layered);
      if (!env_spec) {
        *code = kExitInvalidSpec;
        return;
      }
      envs.emplace_back(name, *env_spec);
    }
    auto files = k8s::Kustomize(*spec, envs, "job");
    if (Status st = WriteTree(f->out, files); !st.ok()) {
      std::fprintf(stderr, "trainctl render: %s\n", st.message().c_str());
      *code = kExitError;
      return;
    }
    std::printf("wrote %zu files under %s: base/ and %zu overlay(s); apply one with "
                "kubectl apply -k %s/overlays/NAME\n", files.size(), f->out.c_str(), envs.size(),
                f->out.c_str());
  });
  (void)flags;
}

}  // namespace trainctl::cli
