// The environment contract with a real client: Debian's python3-torch initialises a gloo
// process group from env:// under trainctl and runs an allreduce whose result it checks.
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace trainctl::testing {
namespace {

TEST(TorchClient, UnmodifiedDdpScriptAllreducesAcrossNodesAndWorkers) {
  SpawnOptions probe;
  probe.argv = {TRAINCTL_TEST_PYTHON, "-c", "import torch.distributed"};
  probe.env = CurrentEnvironment();
  auto has_torch = RunCommand(probe, std::chrono::seconds(60));
  if (!has_torch.ok() || has_torch->exit.code != 0) {
    GTEST_FAIL() << TRAINCTL_TEST_PYTHON << " with torch is required (apt-get install python3-torch)";
  }
  Scratch s;
  s.Write("job.yaml", std::string("name: ddp\nnodes: 2\nprocs_per_node: 2\ncommand: [") +
                          TRAINCTL_TEST_PYTHON + ", " + TRAINCTL_SOURCE_DIR +
                          "/tests/python/allreduce.py]\noutput_dir: " + s.path("out") + "\n");
  auto r = Trainctl({"run", "job.yaml"}, s.path(""), std::chrono::seconds(120));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    auto result = nlohmann::json::parse(s.Read("out/result-" + std::to_string(rank) + ".json"));
    EXPECT_EQ(result["rank"], rank);
    EXPECT_EQ(result["world"], 4);
    EXPECT_EQ(result["sum"], (std::vector<double>{10.0, 4.0}));  // 1+2+3+4, and 4 ones
    EXPECT_EQ(result["local_rank"], rank % 2);
    EXPECT_EQ(result["group_rank"], rank / 2);
  }
}

}  // namespace
}  // namespace trainctl::testing
