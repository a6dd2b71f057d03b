// Kubernetes manifests for a job spec: `trainctl render --target k8s`. Pure functions of the spec
// (no cluster, no clock, no randomness), so the same spec renders the same bytes.
//
// Objects, in apply order: ServiceAccount, ConfigMap (the resolved spec), PVC (unless the spec
// names a claim), NetworkPolicy, headless Service, an etcd (elastic jobs without their own
// rendezvous URL), the data-staging Job, the training workload, the eval Job, TensorBoard, and a
// Role for the people who submit it. A job with roles runs one task per pod (each pod's agent
// is told its task with --task ROLE:INDEX), so each role's pods get that role's resources. Every pod meets the
// "restricted" Pod Security Standard; the store token comes from a Secret that no manifest contains.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "jobspec/job_spec.h"

namespace trainctl::k8s {

// job: Indexed Jobs (no operator): one for a job without roles (a pod per node), one per role
// otherwise (a pod per task). pytorchjob, tfjob: the Kubeflow Training Operator's kinds (v1);
// mpijob: the MPI Operator's MPIJob (v2beta1), a launcher running mpirun over ssh into its
// workers; trainjob: Kubeflow Trainer v2's TrainJob on its torch-distributed runtime.
inline const std::vector<std::string> kFormats = {"job", "pytorchjob", "tfjob", "mpijob", "trainjob"};

constexpr int kStorePort = 29400;

// What the data-staging Job runs (sh -c; URL, SHA256 and DEST in its environment), and the etcd
// of elastic jobs: shared by the manifests and the Helm chart.
extern const char* const kStageScript;
extern const char* const kEtcdImage;

// The spec as the pods see it: relative output, checkpoint, working and data directories moved
// under the shared volume's mount, the rendezvous pointed at the in-cluster store.
JobSpec PodSpec(const JobSpec& spec);

// Whether `format` can express the job, and its text reach the pods as it is; kInvalidArgument
// naming the field and what to use instead.
Status CheckFormat(const JobSpec& spec, const std::string& format);

// The manifests, in apply order. `format` is one of kFormats and passed CheckFormat.
std::vector<nlohmann::json> Render(const JobSpec& spec, const std::string& format);

// For `submit`: the agents' TRAINCTL_RUN_ID set to `run_id` (a fresh one per submission) in the
// formats whose pods learn no uid of their object (the Training Operator's PyTorchJob and TFJob:
// no label carries it); the other formats' pods take theirs from a uid and are left as they are.
void SetSubmissionRunId(std::vector<nlohmann::json>* objects, const std::string& run_id);

// Multi-document YAML ("---" between documents), keys sorted.
std::string ToYaml(const std::vector<nlohmann::json>& docs);

// A kustomize tree: overlays/<env>/ for each environment, whose objects are those of the spec
// `base` layered with that environment's files, over base/: the objects of `base` that every
// environment has. Overlays carry JSON patches (RFC 6902) against the base plus whole objects
// that the base lacks. Paths are relative to the output directory. Works with kustomize 2
// (kubectl 1.14+) and later.
std::map<std::string, std::string> Kustomize(const JobSpec& base,
                                             const std::vector<std::pair<std::string, JobSpec>>& envs,
                                             const std::string& format);

// A Helm chart for the job (`render --format helm`): Chart.yaml, values.yaml (`values`: the spec
// as written, JSON text; see LayeredSpecJson), values.schema.json (the job spec's JSON Schema) and
// templates/ whose objects for those values are Render(spec, format)'s, plus the token Secret, a
// `helm test` pod and NOTES.txt. Paths are relative to the chart's directory.
std::map<std::string, std::string> HelmChart(const JobSpec& spec, const std::string& values, const std::string& format,
                                             const std::string& version);

}  // namespace trainctl::k8s
