#include "rendezvous/rendezvous.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/address.h"
#include "common/strings.h"
#include "job/keys.h"

namespace trainctl {
namespace {

using json = nlohmann::json;

struct Member {
  std::string id;
  int hint = -1;
  int restarts = 0;
  int slot = -1;  // not in the state: where the closer found it
};

struct State {
  int restarts = 0;
  bool closed = false;
  std::vector<Member> nodes;  // by rank once closed; by slot while open

  std::string Encode() const {
    json n = json::array();
    for (const auto& m : nodes) n.push_back({{"id", m.id}, {"hint", m.hint}});
    return json{{"v", 1}, {"restarts", restarts}, {"closed", closed}, {"nodes", n}}.dump();
  }
  int IndexOf(const std::string& id) const {
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].id == id) return static_cast<int>(i);
    }
    return -1;
  }
};

Clock::time_point Now(const RendezvousOptions& o) { return o.now ? o.now() : Clock::now(); }

Result<std::pair<size_t, std::string>> WaitForAny(Store& store, const RendezvousOptions& o,
                                                  const std::vector<std::string>& keys, Duration timeout) {
  return o.wait_for_any ? o.wait_for_any(store, keys, timeout) : store.WaitAny(keys, timeout);
}

Status Corrupt(int round, const std::string& what, const std::string& why) {
  return Internal("rendezvous round " + std::to_string(round) + " has a corrupt " + what + ": " + why);
}

Result<State> DecodeState(int round, const std::string& text) {
  try {
    auto j = json::parse(text);
    State s;
    s.restarts = j.at("restarts").get<int>();
    s.closed = j.at("closed").get<bool>();
    for (const auto& n : j.at("nodes")) s.nodes.push_back({n.at("id"), n.at("hint")});
    return s;
  } catch (const json::exception& e) {
    return Corrupt(round, "state", e.what());
  }
}

std::string EncodeMember(const Member& m) {
  return json{{"id", m.id}, {"hint", m.hint}, {"restarts", m.restarts}}.dump();
}

Result<Member> DecodeMember(int round, const std::string& text) {
  try {
    auto j = json::parse(text);
    return Member{j.at("id"), j.at("hint"), j.at("restarts")};
  } catch (const json::exception& e) {
    return Corrupt(round, "member record", e.what());
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

// The round's closed state, or nullopt while it is open.
Result<std::optional<State>> ClosedState(Store& store, int round) {
  ASSIGN_OR_RETURN(auto text, store.TryGet(keys::RoundState(round)));
  if (!text) return std::optional<State>();
  ASSIGN_OR_RETURN(State s, DecodeState(round, *text));
  return std::optional<State>(std::move(s));
}

// The members of the first `slots` slots that have recorded themselves (an open round's view).
Result<std::vector<Member>> Members(Store& store, int round, int slots) {
  std::vector<Member> members;
  for (int i = 0; i < slots; ++i) {
    ASSIGN_OR_RETURN(auto text, store.TryGet(keys::RoundMember(round, i)));
    if (!text) continue;
    ASSIGN_OR_RETURN(Member m, DecodeMember(round, *text));
    members.push_back(std::move(m));
  }
  return members;
}

Result<int> Joined(Store& store, int round) {
  ASSIGN_OR_RETURN(int64_t n, store.Add(keys::RoundJoined(round), 0));
  return static_cast<int>(n);
}

// Everything an agent learns of a closed round: its rank, or that it is not in it.
Result<std::optional<RoundInfo>> Finish(Store& store, int round, const State& s, const std::string& id) {
  const int me = s.IndexOf(id);
  if (me < 0) return std::optional<RoundInfo>();
  RETURN_IF_ERROR(store.Set(keys::kCurrentRound, std::to_string(round)));
  return std::optional<RoundInfo>(Info(round, s, me));
}

// What a member learns from its slot's rank key ("<rank> <world size> <restarts>").
Result<std::optional<RoundInfo>> FromRankKey(int round, const std::string& value) {
  RoundInfo info;
  info.round = round;
  if (std::sscanf(value.c_str(), "%d %d %d", &info.group_rank, &info.group_world_size, &info.restarts) != 3) {
    return Corrupt(round, "rank key", "\"" + value + "\"");
  }
  return std::optional<RoundInfo>(info);
}

Status TimedOut(Store& store, int round, const RendezvousOptions& o, const std::string& why = "") {
  ASSIGN_OR_RETURN(int joined, Joined(store, round));
  ASSIGN_OR_RETURN(auto members, Members(store, round, std::min(joined, o.max_nodes)));
  std::vector<std::string> ids, missing;
  for (const auto& m : members) ids.push_back(m.id);
  for (int r = 0; r < o.max_nodes && missing.size() < 16 && o.rank_hint >= 0; ++r) {
    if (std::none_of(members.begin(), members.end(), [r](const Member& m) { return m.hint == r; })) {
      missing.push_back(std::to_string(r));
    }
  }
  if (ids.size() > 64) {
    ids.resize(64);
    ids.push_back("...");
  }
  const std::string need = o.min_nodes == o.max_nodes ? std::to_string(o.max_nodes)
                                                      : "at least " + std::to_string(o.min_nodes) + " (max " +
                                                            std::to_string(o.max_nodes) + ")";
  return Timeout("rendezvous round " + std::to_string(round) + ": " + std::to_string(members.size()) + " of " + need +
                 " nodes joined within " + FormatDuration(o.timeout) + " (joined: " + Join(ids, ", ") + ")" +
                 (missing.empty() ? "" : "; missing node rank(s) " + Join(missing, ", ")) + why);
}

// Closes the round with the members of slots [0, slots): waits for each to have recorded itself
// (it took its slot a moment before), ranks them and writes the state. Another closer may win;
// either way the round is closed when this returns ok, unless an elastic round had too few: an
// elastic round closes without a slot whose record does not come within a second (its agent died
// between taking the slot and filling it; a slow one that fills it later finds the round closed
// without it and joins the next), while a fixed-size round needs every slot.
Status Close(Store& store, int round, int slots, Clock::time_point deadline, const RendezvousOptions& o) {
  const bool elastic = o.min_nodes < o.max_nodes;
  const auto give_up = elastic ? std::min(deadline, Now(o) + std::chrono::seconds(1)) : deadline;
  State s;
  s.closed = true;
  for (int i = 0; i < slots; ++i) {
    while (true) {
      ASSIGN_OR_RETURN(auto text, store.TryGet(keys::RoundMember(round, i)));
      if (text) {
        ASSIGN_OR_RETURN(Member m, DecodeMember(round, *text));
        m.slot = i;
        s.nodes.push_back(std::move(m));
        break;
      }
      if (elastic && Now(o) >= give_up) break;  // closed without it
      if (Now(o) >= deadline) {
        return TimedOut(store, round, o,
                        "; slot " + std::to_string(i) + " was taken and never filled (its agent died?)");
      }
      if (o.check) RETURN_IF_ERROR(o.check());
      auto waited = WaitForAny(store, o, {keys::RoundMember(round, i)},
                               std::max(std::min(Remaining(give_up, Now(o)), o.poll), Duration(1)));
      if (!waited.ok() && waited.status().code() != Code::kTimeout) return waited.status();
    }
  }
  if (static_cast<int>(s.nodes.size()) < o.min_nodes) return Status::Ok();  // too few yet: tried again later
  s.restarts = s.nodes.empty() ? 0 : s.nodes[0].restarts;                   // the first joiner's
  std::stable_sort(s.nodes.begin(), s.nodes.end(), [](const Member& a, const Member& b) {
    return static_cast<unsigned>(a.hint) < static_cast<unsigned>(b.hint);  // -1 last
  });
  const std::string desired = s.Encode();
  ASSIGN_OR_RETURN(std::string now, store.CompareSet(keys::RoundState(round), "", desired));
  if (now != desired) return Status::Ok();  // another closer won; it announces the round
  // In one batch, in order: each slot's rank with the round's size and restarts (what wakes its
  // member), the current round (a node joining the running job starts there), then the closed
  // key (what wakes the slots left out, and the nodes past max).
  std::vector<std::pair<std::string, std::string>> announce;
  announce.reserve(s.nodes.size() + 2);
  const std::string size_and_restarts = " " + std::to_string(s.nodes.size()) + " " + std::to_string(s.restarts);
  for (size_t rank = 0; rank < s.nodes.size(); ++rank) {
    announce.emplace_back(keys::RoundRank(round, s.nodes[rank].slot), std::to_string(rank) + size_and_restarts);
  }
  announce.emplace_back(keys::kCurrentRound, std::to_string(round));
  announce.emplace_back(keys::RoundClosed(round), std::to_string(s.nodes.size()) + " " + std::to_string(s.restarts));
  return store.MultiSet(announce);
}

}  // namespace

std::string NodeId(const std::string& host, long pid) {
  const std::string where = host == "127.0.0.1" || host == "::1" ? HostName() : HostName() + "/" + host;
  return where + ":" + std::to_string(pid);
}

Result<std::optional<RoundInfo>> PeekRound(Store& store, int round) {
  ASSIGN_OR_RETURN(auto closed, ClosedState(store, round));
  if (closed) return std::optional<RoundInfo>(Info(round, *closed, -1));
  ASSIGN_OR_RETURN(int joined, Joined(store, round));
  if (joined == 0) return std::optional<RoundInfo>();
  ASSIGN_OR_RETURN(auto members, Members(store, round, joined));
  State open;
  open.nodes = members;
  open.restarts = members.empty() ? 0 : members[0].restarts;
  return std::optional<RoundInfo>(Info(round, open, -1));
}

Result<std::string> RoundNodeId(Store& store, int round, int rank) {
  ASSIGN_OR_RETURN(auto closed, ClosedState(store, round));
  if (!closed || rank < 0 || rank >= static_cast<int>(closed->nodes.size())) {
    return NotFound("round " + std::to_string(round) + " has no node of rank " + std::to_string(rank));
  }
  return closed->nodes[rank].id;
}

Result<int> CurrentRound(Store& store) {
  ASSIGN_OR_RETURN(auto text, store.TryGet(keys::kCurrentRound));
  return text ? std::atoi(text->c_str()) : 0;
}

Result<std::optional<RoundInfo>> JoinRound(Store& store, int round, int restarts, const RendezvousOptions& o) {
  const auto deadline = Now(o) + o.timeout;
  if (o.rank_hint >= o.max_nodes) {
    return InvalidArgument("node rank " + std::to_string(o.rank_hint) + " is out of range for " +
                           std::to_string(o.max_nodes) + " nodes");
  }
  // A round already closed (a node joining a running job) takes no slot.
  ASSIGN_OR_RETURN(auto closed, ClosedState(store, round));
  if (closed) return Finish(store, round, *closed, o.node_id);
  if (o.rank_hint >= 0) {
    ASSIGN_OR_RETURN(std::string holder, store.CompareSet(keys::RoundHint(round, o.rank_hint), "", o.node_id));
    if (holder != o.node_id && std::find(o.replaces.begin(), o.replaces.end(), holder) != o.replaces.end()) {
      return std::optional<RoundInfo>();
    }
    if (holder != o.node_id) {
      return InvalidArgument("node rank " + std::to_string(o.rank_hint) + " in round " + std::to_string(round) +
                             " is already taken by " + holder);
    }
  }
  ASSIGN_OR_RETURN(int64_t count, store.Add(keys::RoundJoined(round), 1));
  const int slot = static_cast<int>(count) - 1;
  if (slot < o.max_nodes) {
    RETURN_IF_ERROR(store.Set(keys::RoundMember(round, slot), EncodeMember({o.node_id, o.rank_hint, restarts})));
    if (slot == o.max_nodes - 1) RETURN_IF_ERROR(Close(store, round, o.max_nodes, deadline, o));
  }
  // Wait for the round to close (a slot past max: to learn that it closed without this agent):
  // a get of the closed key waits on the server and returns it as it is set.
  std::optional<Clock::time_point> last_call_since;  // when this agent first saw min nodes joined
  // The first joiner closes at the last call; the others two seconds later, should it have died:
  // hundreds of agents each reading every record at the same moment would only slow the close.
  const Duration last_call = o.last_call + (slot == 0 ? Duration(0) : Duration(std::chrono::seconds(2)));
  // Elastic rounds watch the count for their last call; a fixed-size round's members need only
  // the closed key.
  const bool counting = o.min_nodes < o.max_nodes && slot < o.max_nodes;
  auto next_count = Now(o);
  // This slot's rank (a slot past max has none), the closed key, then the interrupt keys: one wait
  // on the store, woken by whichever is set; the rank comes before the closed key.
  std::vector<std::string> wake_on;
  if (slot < o.max_nodes) wake_on.push_back(keys::RoundRank(round, slot));
  const size_t closed_at = wake_on.size();
  wake_on.push_back(keys::RoundClosed(round));
  wake_on.insert(wake_on.end(), o.interrupt_keys.begin(), o.interrupt_keys.end());
  while (true) {
    if (counting && Now(o) >= next_count) {
      next_count = Now(o) + o.poll;
      ASSIGN_OR_RETURN(int joined, Joined(store, round));
      if (joined >= o.min_nodes) {
        if (!last_call_since) last_call_since = Now(o);
        if (Now(o) - *last_call_since >= last_call) {
          RETURN_IF_ERROR(Close(store, round, std::min(joined, o.max_nodes), deadline, o));
        } else {
          next_count = std::min(next_count, *last_call_since + last_call);
        }
      }
    }
    if (Now(o) >= deadline) return TimedOut(store, round, o);
    if (o.check) RETURN_IF_ERROR(o.check());
    Duration wait = std::min(Remaining(deadline, Now(o)), o.check_every);
    if (counting) wait = std::min(wait, Remaining(next_count, Now(o)));
    auto woke = WaitForAny(store, o, wake_on, std::max(wait, Duration(1)));
    if (woke.ok() && woke->first < closed_at) return FromRankKey(round, woke->second);
    // Closed: this slot's rank was written before the closed key, but a store's WaitAny may read
    // the keys one by one (the rank's before the batch, the closed key's after it), so it is read
    // again. Without one, it closed without this slot (a last call before it took it, or past
    // max): not in the round.
    if (woke.ok() && woke->first == closed_at) {
      if (slot < o.max_nodes) {
        ASSIGN_OR_RETURN(auto rank, store.TryGet(keys::RoundRank(round, slot)));
        if (rank) return FromRankKey(round, *rank);
      }
      return std::optional<RoundInfo>();
    }
    if (woke.ok() || woke.status().code() == Code::kAborted) {
      // An interrupt: check() decides. Should it find nothing wrong, the join goes on without
      // the interrupt keys (one that stays set would otherwise wake every wait at once).
      if (o.check) RETURN_IF_ERROR(o.check());
      if (woke.ok()) wake_on.resize(closed_at + 1);
      if (!woke.ok() && !o.check) return woke.status();
    } else if (woke.status().code() != Code::kTimeout) {
      return woke.status();
    }
  }
}

}  // namespace trainctl
