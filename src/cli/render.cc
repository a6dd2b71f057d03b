#include "render/k8s/render.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/verbs.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "render/slurm/sbatch.h"

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

// Whether `image` is trainctl's own (deploy/Dockerfile's runtime stage): its repository is named
// trainctl, whatever the registry, and its tag is not the python stage's.
bool IsTrainctlImage(const std::string& image) {
  std::string name = image.substr(0, image.find('@'));
  std::string tag;
  const size_t slash = name.rfind('/');
  if (const size_t colon = name.rfind(':');
      colon != std::string::npos && (slash == std::string::npos || colon > slash)) {
    tag = name.substr(colon + 1);
    name.resize(colon);
  }
  return name.substr(slash == std::string::npos ? 0 : slash + 1) == "trainctl" && tag.rfind("python", 0) != 0;
}

// What trainctl's own image has to run besides trainctl (Debian's slim base).
bool InTrainctlImage(const std::string& program) {
  static const std::vector<std::string> kTools = {"trainctl", "sh",    "bash", "dash", "env", "true", "false",
                                                  "echo",     "sleep", "cat",  "curl", "tar", "gzip", "unzip"};
  const std::string base = program.substr(program.rfind('/') + 1);
  return std::find(kTools.begin(), kTools.end(), base) != kTools.end();
}

// `dir` without its trailing slashes ("/" stays "/").
std::string TrimSlashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// Overlays a previous `render --format kustomize` wrote into `out` that no --env names now:
// removed, so `kubectl apply -k` cannot pick up a stale environment. Only directories holding a
// kustomization.yaml are touched.
void RemoveStaleOverlays(const std::string& out, const std::vector<std::pair<std::string, JobSpec>>& envs) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(out + "/overlays", ec)) {
    const std::string name = e.path().filename().string();
    const bool wanted = std::any_of(envs.begin(), envs.end(), [&](const auto& env) { return env.first == name; });
    if (wanted || !e.is_directory() || !Exists(e.path().string() + "/kustomization.yaml")) continue;
    std::filesystem::remove_all(e.path(), ec);
    std::printf("removed %s/overlays/%s, which no --env names now\n", out.c_str(), name.c_str());
  }
}

}  // namespace

std::vector<std::string> ClusterWarnings(const JobSpec& spec, const std::string& spec_file, const std::string& format) {
  std::vector<std::string> warnings;
  // trainctl's own image, of a stage that cannot run this job: the CPU image for a GPU trainer,
  // an image without sshd for an MPIJob's workers.
  const std::string& image = spec.cluster.image;
  if (IsTrainctlImage(image) && spec.trainer.enabled && spec.trainer.device == "cuda" &&
      image.find("cuda") == std::string::npos) {
    warnings.push_back(spec_file +
                       ": trainer.device: cuda needs trainctl's CUDA image (deploy/Dockerfile.cuda, "
                       "tagged trainctl:cuda for example); cluster.image is " +
                       image + ", deploy/Dockerfile's CPU build, whose LibTorch has no CUDA");
  }
  if (IsTrainctlImage(image) && format == "mpijob" && image.find("mpi") == std::string::npos) {
    warnings.push_back(
        spec_file +
        ": --format mpijob: the workers run sshd and the launcher mpirun, which only "
        "deploy/Dockerfile's mpi stage has (docker build -f deploy/Dockerfile --target mpi -t trainctl:mpi .); "
        "cluster.image is " +
        image);
  }
  // Kubernetes pulls an image tagged :latest (or untagged) on every start unless the pod says
  // IfNotPresent, and Trainer's runtime patches cannot say so for the node container.
  if (format == "trainjob" && image.find('@') == std::string::npos) {
    const size_t colon = image.rfind(':'), slash = image.rfind('/');
    const bool tagged = colon != std::string::npos && (slash == std::string::npos || colon > slash);
    if (!tagged || image.substr(colon + 1) == "latest") {
      warnings.push_back(spec_file + ": cluster.image: " + image +
                         " is pulled from its registry each time a TrainJob's "
                         "node starts (Kubernetes pulls :latest always, and Trainer v2.3 cannot set the node's pull "
                         "policy); an image that is only on the nodes needs a tag other than latest, or a digest");
    }
  }
  const auto roles = JobRoles(spec, spec.nodes.max);
  std::vector<std::string> seen;
  for (size_t i = 0; i < roles.size() && IsTrainctlImage(spec.cluster.image); ++i) {
    const RoleSpec& role = roles[i];
    if (role.command.empty() || InTrainctlImage(role.command[0])) continue;  // the built-in trainer, or sh
    if (std::find(seen.begin(), seen.end(), role.command[0]) != seen.end()) continue;
    seen.push_back(role.command[0]);
    std::string local;  // a script named by a relative path that exists only here (next to the spec)
    const std::string base = ProgramBase(spec, spec_file);
    for (size_t a = 1; a < role.command.size() + role.args.size(); ++a) {
      const std::string& arg = a < role.command.size() ? role.command[a] : role.args[a - role.command.size()];
      if (!arg.empty() && arg[0] != '/' && arg[0] != '-' && Exists(base + "/" + arg) &&
          !IsDirectory(base + "/" + arg)) {
        local = ", and " + arg + " is a file on this machine, which the pods do not see";
        break;
      }
    }
    const std::string field = spec.roles.empty() ? "command" : "roles[" + std::to_string(i) + "].command";
    warnings.push_back(spec_file + ": " + field + ": runs " + role.command[0] + ", which trainctl's own image (" +
                       spec.cluster.image + ") does not have" + local +
                       "; set cluster.image to an image with your program, its code and trainctl in it "
                       "(docs/own-program.md)");
  }
  // The trainer's files named by relative paths: the pods look for them on the shared volume.
  if (spec.trainer.enabled) {
    const std::string base = ProgramBase(spec, spec_file);
    const std::string& mount = spec.cluster.storage.mount;
    for (const auto& [field, path] :
         {std::pair<std::string, std::string>{"trainer.model.torchscript", spec.trainer.torchscript},
          {"trainer.data.dir", spec.trainer.data.dir},
          {"trainer.data.test_dir", spec.trainer.data.test_dir}}) {
      if (path.empty() || path[0] == '/' || !Exists(base + "/" + path)) continue;
      warnings.push_back(spec_file + ": " + field + ": " + path + " is " +
                         (IsDirectory(base + "/" + path) ? "a folder" : "a file") +
                         " on this machine, which the pods do "
                         "not see: they read " +
                         mount + "/" + path +
                         " on the shared volume (cluster.storage); copy it "
                         "there, or stage it (cluster.stage)");
    }
  }
  return warnings;
}

// What `kubectl apply` of rendered manifests needs first: the store token's Secret, which no
// manifest holds (trainctl submit and the Helm chart make it themselves). docs/cluster.md.
static std::string TokenSecretHint(const JobSpec& s) {
  const std::string secret = s.cluster.token_secret.empty() ? s.name + "-token" : s.cluster.token_secret;
  return "before kubectl apply, create the store token's Secret once (trainctl submit does this itself):\n"
         "  kubectl create secret generic " +
         secret + " -n " + s.cluster.namespace_ + " --from-literal=token=\"$(openssl rand -hex 32)\"\n";
}

namespace {

struct RenderFlags {
  SpecFlags spec;
  std::string target = "k8s";
  std::string format = "job";
  std::string workload = "job";
  std::vector<std::string> envs;
  std::string out;
  std::string trainctl = "trainctl";
};

// --target slurm: the batch script, on stdout or as OUT/<name>.sbatch.
int RenderSlurm(const JobSpec& spec, RenderFlags& f) {
  if (f.trainctl == "trainctl" && !FindExecutable("trainctl", CurrentEnvironment()).ok()) {
    std::fprintf(stderr,
                 "trainctl render: warning: the script runs 'trainctl' from the nodes' PATH, and it is "
                 "not on this machine's (this one is %s); if the nodes lack it too, give --trainctl "
                 "with its path on the shared filesystem\n",
                 SelfExe().c_str());
  }
  // The script runs the same spec sources, from the shared filesystem.
  std::vector<std::string> args;
  for (size_t i = 0; i < f.spec.Sources().files.size(); ++i) {
    if (i > 0) args.push_back("-f");
    args.push_back(AbsolutePath(f.spec.Sources().files[i]));
  }
  for (const auto& set : f.spec.sets) args.insert(args.end(), {"--set", set});
  const std::string script = slurm::SbatchScript(spec, args, f.trainctl);
  if (f.out.empty()) {
    std::fputs(script.c_str(), stdout);
    return kExitOk;
  }
  const std::string path = f.out + "/" + spec.name + ".sbatch";
  Status st = MakeDirs(f.out);
  if (st.ok()) st = AtomicWriteFile(path, script, 0755);
  if (!st.ok()) {
    std::fprintf(stderr, "trainctl render: %s\n", st.message().c_str());
    return kExitError;
  }
  std::printf("wrote %s; submit it with sbatch %s\n", path.c_str(), path.c_str());
  return kExitOk;
}

// --format helm: a chart whose values are the spec's layers.
int RenderHelm(const JobSpec& spec, RenderFlags& f, const std::string& workload) {
  if (f.out.empty() || !f.envs.empty()) {
    std::fprintf(stderr,
                 "trainctl render: --format helm writes a chart's directory; give it with -o DIR "
                 "(environments are values files at install time: helm install -f dev.yaml)\n");
    return kExitInvalidSpec;
  }
  auto values = LayeredSpecJson(f.spec.Sources());
  Status st = values.status();
  if (st.ok()) st = WriteTree(f.out, k8s::HelmChart(spec, *values, workload, TRAINCTL_VERSION));
  if (!st.ok()) {
    std::fprintf(stderr, "trainctl render: %s\n", st.message().c_str());
    return kExitError;
  }
  std::printf("wrote the chart %s (%s) under %s; install it with helm install %s %s --namespace %s\n",
              spec.name.c_str(), workload.c_str(), f.out.c_str(), spec.name.c_str(), f.out.c_str(),
              spec.cluster.namespace_.c_str());
  return kExitOk;
}

// --format job, pytorchjob, tfjob, mpijob or trainjob: one manifest file, or stdout.
int RenderManifests(const JobSpec& spec, RenderFlags& f) {
  if (!f.envs.empty()) {
    std::fprintf(stderr, "trainctl render: --env goes with --format kustomize\n");
    return kExitInvalidSpec;
  }
  const std::string yaml = k8s::ToYaml(k8s::Render(spec, f.format));
  if (f.out.empty()) {
    std::fputs(yaml.c_str(), stdout);
    return kExitOk;
  }
  if (Status st = WriteTree(f.out, {{spec.name + ".yaml", yaml}}); !st.ok()) {
    std::fprintf(stderr, "trainctl render: %s\n", st.message().c_str());
    return kExitError;
  }
  std::printf("wrote %s/%s.yaml\n%s", f.out.c_str(), spec.name.c_str(), TokenSecretHint(spec).c_str());
  return kExitOk;
}

// --format kustomize: a base and one overlay per --env.
int RenderKustomize(const JobSpec& spec, RenderFlags& f) {
  if (f.out.empty()) {
    std::fprintf(stderr, "trainctl render: --format kustomize writes a directory tree; give it with -o DIR\n");
    return kExitInvalidSpec;
  }
  std::vector<std::pair<std::string, JobSpec>> envs;
  for (const auto& e : f.envs) {
    auto eq = e.find('=');
    const std::string name = e.substr(0, eq);
    if (eq == std::string::npos || name.empty() || eq + 1 == e.size() ||
        name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-_") != std::string::npos) {
      std::fprintf(stderr,
                   "trainctl render: --env %s: expected NAME=FILE[,FILE...], NAME in "
                   "lowercase letters, digits, '-' and '_'\n",
                   e.c_str());
      return kExitInvalidSpec;
    }
    SpecFlags layered = f.spec;
    for (const auto& file : Split(e.substr(eq + 1), ',')) layered.files.push_back(file);
    auto env_spec = LoadOrReport(layered);
    if (!env_spec) {
      return kExitInvalidSpec;
    }
    envs.emplace_back(name, *env_spec);
  }
  RemoveStaleOverlays(f.out, envs);
  auto files = k8s::Kustomize(spec, envs, "job");
  if (Status st = WriteTree(f.out, files); !st.ok()) {
    std::fprintf(stderr, "trainctl render: %s\n", st.message().c_str());
    return kExitError;
  }
  std::printf(
      "wrote %zu files under %s: base/ and %zu overlay(s); apply one with "
      "kubectl apply -k %s/overlays/NAME\n%s",
      files.size(), f.out.c_str(), envs.size(), f.out.c_str(), TokenSecretHint(spec).c_str());
  return kExitOk;
}

int Render(RenderFlags& f) {
  auto spec = LoadOrReport(f.spec);
  if (!spec) return kExitInvalidSpec;
  f.out = TrimSlashes(f.out);
  if (f.target == "slurm") return RenderSlurm(*spec, f);
  const std::string workload = f.format == "helm" ? f.workload : f.format == "kustomize" ? "job" : f.format;
  if (f.workload != "job" && f.format != "helm") {
    std::fprintf(stderr, "trainctl render: --workload goes with --format helm\n");
    return kExitInvalidSpec;
  }
  if (Status st = k8s::CheckFormat(*spec, workload); !st.ok()) {
    std::fprintf(stderr, "%s: %s\n", f.spec.Sources().files[0].c_str(), st.message().c_str());
    return kExitInvalidSpec;
  }
  for (const auto& w : ClusterWarnings(*spec, f.spec.Sources().files[0], workload)) {
    std::fprintf(stderr, "warning: %s\n", w.c_str());
  }
  if (f.format == "helm") return RenderHelm(*spec, f, workload);
  if (f.format != "kustomize") return RenderManifests(*spec, f);
  return RenderKustomize(*spec, f);
}

}  // namespace

void AddRender(CLI::App& app, const GlobalFlags& flags, int* code) {
  auto* cmd = app.add_subcommand(
      "render",
      "Write what runs the job on a cluster engine: Kubernetes manifests (Indexed Jobs, or "
      "Kubeflow's PyTorchJob, TFJob, MPIJob or TrainJob), a kustomize base with one overlay per "
      "environment, a Helm chart, or a Slurm batch script. Nothing is contacted; see docs/cluster.md");
  static RenderFlags storage;
  RenderFlags* f = &storage;
  f->spec.Add(cmd);
  cmd->add_option("--target", f->target, "the cluster engine")
      ->capture_default_str()
      ->check(CLI::IsMember({"k8s", "slurm"}));
  std::vector<std::string> formats = k8s::kFormats;
  formats.push_back("kustomize");
  formats.push_back("helm");
  cmd->add_option("--format", f->format,
                  "k8s: job (Indexed Jobs, no operator; one per role for jobs with roles), "
                  "pytorchjob or tfjob (Kubeflow Training Operator), mpijob (MPI Operator v2beta1), "
                  "trainjob (Kubeflow Trainer v2), kustomize (a base plus overlays, see --env; needs -o), "
                  "helm (a chart whose values are the spec, see --workload; needs -o)")
      ->capture_default_str()
      ->check(CLI::IsMember(formats));
  cmd->add_option("--workload", f->workload,
                  "helm: the workload format the chart makes (job, pytorchjob, tfjob, mpijob, trainjob)")
      ->capture_default_str()
      ->check(CLI::IsMember(k8s::kFormats));
  cmd->add_option("--env", f->envs, "kustomize: an overlay, NAME=FILE[,FILE...]: the spec layered with these files")
      ->allow_extra_args(false);
  cmd->add_option("-o,--output", f->out, "a directory to write into (default: stdout)");
  cmd->add_option("--trainctl", f->trainctl, "slurm: the trainctl binary as the nodes see it")->capture_default_str();
  cmd->callback([f, code] { *code = Render(*f); });
  (void)flags;
}

}  // namespace trainctl::cli
