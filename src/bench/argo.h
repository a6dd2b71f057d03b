// `trainctl bench MATRIX --format argo`: the matrix as an Argo Workflow, for clusters that have
// Argo. One DAG task per experiment (failFast off: a failed experiment does not stop the others),
// the matrix's `parallel` as the workflow's parallelism, and an exit handler that runs
// `trainctl bench --collect` on the shared volume, so the result set and the report are written
// however the experiments ended. Each experiment runs in one pod of the trainctl image: a trainctl
// job with its resolved spec (given as a raw artifact; all its nodes in that pod), or a peer's
// command (its output and exit code kept beside it). Results go to
// <cluster.storage.mount>/bench/<name>/<stamp>/ on the spec's volume.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "bench/matrix.h"

namespace trainctl::bench {

// Where the rendered workflow's result set lives on the volume.
std::string ArgoResultsDir(const JobSpec& base, const Matrix& m, const std::string& stamp);

// The workflow; `base_file` is the matrix's spec file (the inline spec written out), `stamp` names
// this run (the workflow is <name>-<stamp>: submitting the same file twice is refused).
Result<nlohmann::json> ArgoWorkflow(const Matrix& m, const std::string& base_file, const std::string& stamp);

// The matrix with its spec inline and its layers applied: what the exit handler reads in a pod
// where the matrix's files are not.
Result<std::string> SelfContainedMatrix(const Matrix& m, const std::string& base_file);

}  // namespace trainctl::bench
