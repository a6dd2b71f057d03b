#include "metrics/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/fs.h"
#include "common/strings.h"
#include "metrics/timeline.h"

namespace trainctl::metrics {
namespace {

namespace fs = std::filesystem;

TEST(Crc32c, MatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);  // CRC-32C's published check value
  EXPECT_EQ(Crc32c("", 0), 0u);
}

// Reads TFRecord framing back and checks both masked CRCs of every record.
std::vector<std::string> ReadRecords(const std::string& bytes) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos + 12 <= bytes.size()) {
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, bytes.data() + pos, 8);
    std::memcpy(&len_crc, bytes.data() + pos + 8, 4);
    EXPECT_EQ(len_crc, MaskedCrc32c(bytes.data() + pos, 8));
    std::string data = bytes.substr(pos + 12, len);
    std::memcpy(&data_crc, bytes.data() + pos + 12 + len, 4);
    EXPECT_EQ(data_crc, MaskedCrc32c(data.data(), data.size()));
    out.push_back(data);
    pos += 12 + len + 4;
  }
  EXPECT_EQ(pos, bytes.size());
  return out;
}

TEST(EventWriter, WritesFramedScalarEvents) {
  fs::path dir = fs::temp_directory_path() / ("tfevents-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto w = EventWriter::Open(dir.string());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::unique_ptr<EventWriter> writer(*w);
  EXPECT_NE(writer->path().find("/events.out.tfevents."), std::string::npos);
  ASSERT_TRUE(writer->AddScalar("train/loss", 0.25, 42, 1700000000.5).ok());
  auto bytes = ReadFile(writer->path());
  ASSERT_TRUE(bytes.ok());
  auto records = ReadRecords(*bytes);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  // Event{wall_time=1, step=2, summary=5{value=1{tag=1, simple_value=2}}}, hand-checked bytes.
  const std::string& e = records[1];
  ASSERT_EQ(e[0], 0x09);
  double wall;
  std::memcpy(&wall, e.data() + 1, 8);
  EXPECT_EQ(wall, 1700000000.5);
  EXPECT_EQ(e.substr(9, 2), std::string("\x10\x2a", 2));  // step 42
  float value = 0.25f;
  std::string tail = "\x0a\x0atrain/loss\x15" + std::string(reinterpret_cast<char*>(&value), 4);
  EXPECT_NE(e.find(tail), std::string::npos);
  fs::remove_all(dir);
}

TEST(JsonLines, WritesOneParsableObjectPerLineWithExactNumbers) {
  fs::path path = fs::temp_directory_path() / ("metrics-" + std::to_string(::getpid()) + ".jsonl");
  fs::remove(path);
  {
    auto j = JsonLines::Open(path.string());
    ASSERT_TRUE(j.ok());
    std::unique_ptr<JsonLines> lines(*j);
    ASSERT_TRUE(
        lines->Write({{"step", 3}, {"loss", 0.1f}, {"time", 1795355798.125}}, {{"note", "a \"quoted\"\nline"}}).ok());
    ASSERT_TRUE(lines->Write({{"nan", std::nan("")}}).ok());
  }
  auto text = ReadFile(path.string());
  auto lines = SplitLines(*text);
  ASSERT_EQ(lines.size(), 2u);
  auto a = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(a["step"], 3);
  EXPECT_EQ(a["loss"].get<double>(), double(0.1f));
  EXPECT_EQ(a["time"].get<double>(), 1795355798.125);
  EXPECT_EQ(a["note"], "a \"quoted\"\nline");
  EXPECT_TRUE(nlohmann::json::parse(lines[1])["nan"].is_null());
  fs::remove(path);
}

TEST(Progress, ShowsBarPercentAndEta) {
  std::string line = ProgressLine(2, 5, 50, 100, 0.5, 1000, 90, 10);
  // 50 steps left in this epoch, 300 in the job: the bar's ETA is this epoch's, the job's follows.
  EXPECT_EQ(line, "epoch 2/5 [#####.....]  50% 50/100 loss 0.5000 1000 samples/s ETA 12.857s (job 1m30s)");
  EXPECT_EQ(ProgressLine(5, 5, 50, 100, 0.5, 1000, 30, 10),
            "epoch 5/5 [#####.....]  50% 50/100 loss 0.5000 1000 samples/s ETA 30s");
}

// The spans of the steps asked for, back to back, as trace events a trace viewer places on its
// rank's row; nothing for the other steps.
TEST(Timeline, RecordsTheStepsAskedForAsTraceEventsOfTheirRank) {
  Timeline t(3, 4);
  for (int64_t step = 1; step <= 6; ++step) {
    Timeline::Step phases(&t, step);
    phases.Items(10 + step);
    phases.End("forward");
    phases.End("backward");
  }
  {
    Timeline::Step none(nullptr, 3);  // no timeline: nothing to do
    none.End("forward");
  }
  auto events = nlohmann::json::parse(t.Events(1, "10.0.0.7", 5, "worker-4"));
  std::map<std::string, std::string> names;
  std::vector<nlohmann::json> spans;
  for (const auto& e : events) {
    if (e["ph"] == "M") {
      names[e["name"].get<std::string>()] = e["args"].dump();
    } else {
      ASSERT_EQ(e["ph"], "X");
      EXPECT_EQ(e["pid"], 1);
      EXPECT_EQ(e["tid"], 5);
      spans.push_back(e);
    }
  }
  EXPECT_EQ(names["process_name"], R"j({"name":"node 1 (10.0.0.7)"})j");
  EXPECT_EQ(names["thread_name"], R"j({"name":"rank 5 (worker-4)"})j");
  ASSERT_EQ(spans.size(), 6u);  // steps 3 and 4: forward, backward, step
  std::map<int64_t, std::map<std::string, nlohmann::json>> by_step;
  for (const auto& s : spans) by_step[s["args"]["step"].get<int64_t>()][s["name"].get<std::string>()] = s;
  ASSERT_EQ(by_step.size(), 2u);
  for (auto& [step, s] : by_step) {
    EXPECT_TRUE(step == 3 || step == 4) << step;
    auto end = [](const nlohmann::json& e) { return e["ts"].get<int64_t>() + e["dur"].get<int64_t>(); };
    EXPECT_EQ(s["backward"]["ts"].get<int64_t>(), end(s["forward"]));  // back to back
    EXPECT_EQ(s["step"]["ts"], s["forward"]["ts"]);
    EXPECT_EQ(s["step"]["args"]["items"], 10 + step);  // the batch, on the step's span only
    EXPECT_FALSE(s["forward"]["args"].contains("items"));
    EXPECT_EQ(end(s["step"]), end(s["backward"]));
  }
  EXPECT_LE(by_step[3]["step"]["ts"].get<int64_t>(), by_step[4]["step"]["ts"].get<int64_t>());
}

TEST(Timeline, MergesTheRanksIntoOneTraceAndRefusesAPartThatIsNotOne) {
  Timeline a(1, 1), b(1, 1);
  {
    Timeline::Step s(&a, 1);
    s.End("forward");
  }
  {
    Timeline::Step s(&b, 1);
    s.End("forward");
  }
  auto merged = MergeTimelines({a.Events(0, "", 0), b.Events(0, "", 1)});
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  auto trace = nlohmann::json::parse(*merged);
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  std::set<int> ranks;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") ranks.insert(e["tid"].get<int>());
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));
  auto bad = MergeTimelines({a.Events(0, "", 0), "{\"truncated\": "});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "timeline part 1 is not a JSON array of trace events");
}

}  // namespace
}  // namespace trainctl::metrics
