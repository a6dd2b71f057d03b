#include "rendezvous/rendezvous.h"

#include <algorithm>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/strings.h"
#include "job/keys.h"

namespace trainctl {
namespace {

using json = nlohmann::json;


struct Member {
  std::string id;
  int hint = -1;
};

struct State {
  int64_t version = 0;
  int restarts = 0;
  bool closed = false;
  std::vector<Member> nodes;

  std::string Encode() const {
    json n = json::array();
    for (const auto& m : nodes) n.push_back({{"id", m.id}, {"hint", m.hint}});
    return json{{"v", version}, {"restarts", restarts}, {"closed", closed}, {"nodes", n}}.dump();
  }
  int IndexOf(const std::string& id) const {
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].id == id) return static_cast<int>(i);
    }
    return -1;
  }
  // Closing fixes the ranks: hinted nodes by hint, then the others by arrival.
  void Close() {
    std::stable_sort(nodes.begin(), nodes.end(), [](const Member& a, const Member& b) {
      unsigned ha = static_cast<unsigned>(a.hint), hb = static_cast<unsigned>(b.hint);  // -1 last
      return ha < hb;
    });
    closed = true;
  }
};

Result<State> Decode(int round, const std::string& text) {
  try {
    auto j = json::parse(text);
    State s;
    s.version = j.at("v").get<int64_t>();
    s.restarts = j.at("restarts").get<int>();
    s.closed = j.at("closed").get<bool>();
    for (const auto& n : j.at("nodes")) s.nodes.push_back({n.at("id"), n.at("hint")});
    return s;
  } catch (const json::exception& e) {
    return Internal("rendezvous round " + std::to_string(round) + " has a corrupt state: " +
                    e.what());
  }
}

RoundInfo Info(int round, const State& s, int rank) {
  RoundInfo info;
  info.round = round;
  info.restarts = s.restarts;
  info.group_rank = rank;
  info.group_world_size = static_cast<int>(s.nodes.size());
  info.closed = s.closed;
  for (const auto& m : s.nodes) info.nodes.push_back(m.id);
  return info;
}

}  // namespace

Result<std::optional<RoundInfo>> PeekRound(Store& store, int round) {
  ASSIGN_OR_RETURN(auto text, store.TryGet(keys::RoundState(round)));
  if (!text) return std::optional<RoundInfo>();
  ASSIGN_OR_RETURN(State s, Decode(round, *text));
  return std::optional<RoundInfo>(Info(round, s, -1));
}

Result<int> CurrentRound(Store& store) {
  ASSIGN_OR_RETURN(auto text, store.TryGet(keys::kCurrentRound));
  return text ? std::atoi(text->c_str()) : 0;
}

Result<std::optional<RoundInfo>> JoinRound(Store& store, int round, int restarts,
                                           const RendezvousOptions& o) {
  const auto deadline = Clock::now() + o.timeout;
  if (o.rank_hint >= o.max_nodes) {
    return InvalidArgument("node rank " + std::to_string(o.rank_hint) + " is out of range for " +
                           std::to_string(o.max_nodes) + " nodes");
  }
  std::optional<Clock::time_point> last_call_since;  // when this agent first saw min nodes
  // A lost compare-and-set backs off for a random while that doubles with each loss (up to
  // 64 ms): without it, hundreds of agents joining at once retry in lockstep and each join
  // costs the store O(nodes) failed rewrites of the round's state.
  std::minstd_rand jitter(std::random_device{}());
  int lost = 0;
  std::optional<std::string> seen;  // the state text last decoded, and what it decoded to
  State seen_state;
  while (true) {
    ASSIGN_OR_RETURN(auto text, store.TryGet(keys::RoundState(round)));
    State s;
    s.restarts = restarts;
    if (text && seen && *text == *seen) {
      s = seen_state;  // unchanged: no need to parse it again (it holds every member)
    } else if (text) {
      ASSIGN_OR_RETURN(s, Decode(round, *text));
      seen = text;
      seen_state = s;
    }
    const std::string expected = text.value_or("");
    int me = s.IndexOf(o.node_id);
    if (s.closed) {
      if (me < 0) return std::optional<RoundInfo>();
      RETURN_IF_ERROR(store.Set(keys::kCurrentRound, std::to_string(round)));
      return std::optional<RoundInfo>(Info(round, s, me));
    }
    State next = s;
    next.version = s.version + 1;
    if (me < 0) {  // join
      for (const auto& m : s.nodes) {
        if (o.rank_hint >= 0 && m.hint == o.rank_hint) {
          return InvalidArgument("node rank " + std::to_string(o.rank_hint) + " in round " +
                                 std::to_string(round) + " is already taken by " + m.id);
        }
      }
      next.nodes.push_back({o.node_id, o.rank_hint});
      if (static_cast<int>(next.nodes.size()) >= o.max_nodes) next.Close();
    } else if (static_cast<int>(s.nodes.size()) >= o.min_nodes) {  // last call
      if (!last_call_since) last_call_since = Clock::now();
      if (Clock::now() - *last_call_since >= o.last_call) next.Close();
    }
    if (next.nodes.size() != s.nodes.size() || next.closed) {
      const std::string desired = next.Encode();
      ASSIGN_OR_RETURN(std::string now, store.CompareSet(keys::RoundState(round), expected, desired));
      if (now == desired && next.closed) RETURN_IF_ERROR(store.Set(keys::RoundClosed(round), "1"));
      if (now != desired) {
        const int64_t cap_us = int64_t{1000} << std::min(lost++, 6);
        std::this_thread::sleep_for(std::chrono::microseconds(jitter() % cap_us));
      } else {
        lost = 0;
      }
      continue;  // won or lost, read the state again
    }
    // A member of a fixed-size round has nothing to do until the round closes, which its closed
    // key announces: it waits on that key (running the checks every poll) and reads the state
    // again only then, or after a second. Hundreds of members re-reading a state that holds
    // them all, every poll, would cost the store and themselves O(nodes^2) each poll.
    if (me >= 0 && o.min_nodes == o.max_nodes && Clock::now() < deadline) {
      const auto until = std::min(deadline, Clock::now() + std::chrono::seconds(1));
      while (Clock::now() < until) {
        if (o.check) RETURN_IF_ERROR(o.check());
        Status waited = store.Wait({keys::RoundClosed(round)}, std::max(std::min(Remaining(until), o.poll), Duration(1)));
        if (waited.ok()) break;
        if (waited.code() != Code::kTimeout) return waited;
      }
      continue;
    }
    if (Clock::now() >= deadline) {
      std::vector<std::string> ids, missing;
      for (const auto& m : s.nodes) ids.push_back(m.id);
      for (int r = 0; r < o.max_nodes && missing.size() < 16; ++r) {
        bool hinted = std::any_of(s.nodes.begin(), s.nodes.end(), [r](const Member& m) { return m.hint == r; });
        if (!hinted && o.rank_hint >= 0) missing.push_back(std::to_string(r));
      }
      std::string need = o.min_nodes == o.max_nodes
                             ? std::to_string(o.max_nodes)
                             : "at least " + std::to_string(o.min_nodes) + " (max " +
                                   std::to_string(o.max_nodes) + ")";
      return Timeout("rendezvous round " + std::to_string(round) + ": " +
                     std::to_string(s.nodes.size()) + " of " + need + " nodes joined within " +
                     FormatDuration(o.timeout) + " (joined: " + Join(ids, ", ") + ")" +
                     (missing.empty() ? "" : "; missing node rank(s) " + Join(missing, ", ")));
    }
    if (o.check) RETURN_IF_ERROR(o.check());
    Duration wait = std::min(Remaining(deadline), o.poll);
    if (last_call_since) wait = std::min(wait, Remaining(*last_call_since + o.last_call));
    Status waited = store.Wait({keys::RoundClosed(round)}, std::max(wait, Duration(1)));
    if (!waited.ok() && waited.code() != Code::kTimeout) return waited;
  }
}

}  // namespace trainctl
