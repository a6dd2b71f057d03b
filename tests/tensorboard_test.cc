// A real TensorBoard reads a trainctl run (issue 74): PyPI's tensorboard (scripts/dev
// pytorch-env) loads the run's event files with its own reader and serves them over HTTP with
// `tensorboard --logdir`; the loss, learning rate and test accuracy series equal metrics.jsonl's.
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

TEST(TensorBoard, ItsReaderAndItsServerShowWhatMetricsJsonlRecords) {
  Scratch s;
  const std::string spec = s.Write("job.yaml", "name: tb\nprocs_per_node: 1\noutput_dir: " + s.path("out") +
                                                   "\ntrainer:\n  model: cnn\n  data: {limit: 2000, test_limit: 200}\n"
                                                   "  batch_size: 32\n  epochs: 2\n  log_every: 10\n  threads: 1\n"
                                                   "  snapshot_every: 0\n");
  auto r = Trainctl({"run", spec}, s.path(""), std::chrono::seconds(120));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  auto read = RunProgram({TRAINCTL_TEST_PYTHON, std::string(TRAINCTL_SOURCE_DIR) + "/tests/python/tensorboard_reads.py",
                          s.path("out"), std::to_string(FreePort())},
                         s.path(""), std::chrono::seconds(150));
  EXPECT_EQ(read.exit.code, 0) << read.output;
  EXPECT_NE(read.output.find("reader train/loss:"), std::string::npos) << read.output;
  EXPECT_NE(read.output.find("http test/accuracy: 2 points equal"), std::string::npos) << read.output;
}

}  // namespace
}  // namespace trainctl::testing
