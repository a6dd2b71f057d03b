// `trainctl bench`'s experiment matrix: a base job spec, axes over any of its fields, extra and
// excluded points, repeats, and peer commands (a PyTorch script) run at the same points.
//
//   name: fashion-mnist-scaling
//   spec: ../examples/fashion-mnist.yaml   # a path (relative to this file) or an inline mapping
//   layers: [fast.yaml]                    # optional, layered on the spec in order
//   set: {trainer.epochs: 1}               # optional, as --set
//   axes: {procs_per_node: [1, 2], trainer.batch_size: [64, 128]}
//   include: [{procs_per_node: 4, trainer.batch_size: 64}]
//   exclude: [{procs_per_node: 1, trainer.batch_size: 128}]
//   repeats: 1                             # >= 5: aggregated as MLPerf does
//   parallel: 1                            # experiments at once (timing runs must not share cores)
//   target_accuracy: 0.9                   # for the time to accuracy
//   target: local                          # local | slurm (an sbatch per experiment) | k8s (Argo)
//   upload: {url: s3://bucket/prefix, endpoint: https://minio.example.com, region: us-east-1}
//   peers:
//     - name: pytorch-ddp
//       command: [python3, -m, torch.distributed.run, --nproc_per_node, "{procs_per_node}", ddp.py]
//
// Errors name the file, the line and the field.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "bench/upload.h"
#include "common/status.h"
#include "jobspec/job_spec.h"

namespace trainctl::bench {

// One point of the matrix: field -> value, as YAML text ("2", "sgd", "[1, 28, 28]"), in axis order.
using Point = std::vector<std::pair<std::string, std::string>>;

struct Peer {
  std::string name;
  std::vector<std::string> command;  // "{field}" in an argument is the point's value of that field
  std::string workers;               // its worker processes: a number or "{field}"; "": the point's world size
};

struct Matrix {
  std::string name;
  std::string path;                 // the matrix file
  std::string spec_file;            // "" when the spec is inline
  std::string inline_spec;          // YAML of an inline spec
  std::vector<std::string> layers;  // absolute or relative to the working directory
  std::vector<std::string> sets;    // "key=value"
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  std::vector<Point> include, exclude;
  int repeats = 1;
  int parallel = 1;
  double target_accuracy = 0;    // 0: none
  std::string target = "local";  // local | slurm | k8s
  UploadTarget upload;           // url "": none
  std::vector<Peer> peers;
};

struct Experiment {
  std::string id;      // unique in the matrix: system, the point's values, the repeat
  std::string system;  // "trainctl" or a peer's name
  Point point;
  int repeat = 0;                    // 0-based
  std::vector<std::string> command;  // a peer's, with the point substituted; empty for trainctl
  int workers = 0;                   // a peer's own count (Peer::workers); 0: the point's world size
};

// Parses and checks a matrix; kInvalidArgument names file:line: field.
Result<Matrix> ParseMatrix(const std::string& text, const std::string& path);
Result<Matrix> LoadMatrix(const std::string& path);

// The points: the axes' cross product (first axis outermost) without the excluded ones, then the
// included ones not already there.
std::vector<Point> Points(const Matrix& m);

// Every experiment, in run order: each point's trainctl job then its peers, repeats outermost.
std::vector<Experiment> Experiments(const Matrix& m);

// The job spec of a trainctl experiment: the matrix's spec, layers, sets and the point, with its
// output directory. `base_file` is the spec's file (the inline spec written out by the caller).
// Repeat r (0-based) trains with trainer.seed + r: each run its own seed, as MLPerf runs are.
Result<JobSpec> ExperimentSpec(const Matrix& m, const std::string& base_file, const Point& point,
                               const std::string& output_dir, int repeat = 0);

}  // namespace trainctl::bench
