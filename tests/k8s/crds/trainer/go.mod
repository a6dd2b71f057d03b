// The Kubeflow Trainer release whose TrainJob CRD (manifests/base/crds in its module) the rendered
// TrainJob is checked against: `scripts/dev deps` downloads the module (its checksum in go.sum)
// and copies the CRD into tests/k8s/crds/fetched/.
module trainctl.dev/tests/k8s/crds/trainer

go 1.26

require github.com/kubeflow/trainer/v2 v2.3.0
