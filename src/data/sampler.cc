#include "data/sampler.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace trainctl::data {

int64_t ShardSize(int64_t n, const SamplerOptions& o) {
  if (o.drop_last) return n / o.world_size;
  return (n + o.world_size - 1) / o.world_size;
}

std::vector<int64_t> EpochOrder(int64_t n, int64_t epoch, const SamplerOptions& o) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (o.shuffle) {
    // Fisher-Yates with a fixed generator: the same permutation on every rank and platform
    // (std::shuffle's algorithm is left to the standard library).
    std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
    for (int64_t i = n - 1; i > 0; --i) {
      uint64_t bound = static_cast<uint64_t>(i) + 1;
      uint64_t limit = UINT64_MAX - UINT64_MAX % bound;  // reject to stay unbiased
      uint64_t r;
      do r = rng();
      while (r >= limit);
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(r % bound)]);
    }
  }
  return order;
}

std::vector<int64_t> ShardIndices(int64_t n, int64_t epoch, const SamplerOptions& o) {
  const std::vector<int64_t> order = EpochOrder(n, epoch, o);
  int64_t per_rank = ShardSize(n, o);
  int64_t total = per_rank * o.world_size;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank));
  for (int64_t k = o.rank; k < total; k += o.world_size) {
    mine.push_back(order[static_cast<size_t>(k % n)]);  // k >= n only when padding
  }
  return mine;
}

std::vector<int64_t> SplitBatch(const std::vector<double>& weights, int64_t batch, int64_t least) {
  const size_t world = weights.size();
  std::vector<int64_t> shares(world, 0);
  if (world == 0) return shares;
  least = std::clamp<int64_t>(least, 0, batch / static_cast<int64_t>(world));
  // By weight; a rank that would get less than `least` gets that, and the others share the rest
  // by weight again, until none is under it.
  std::vector<double> exact(world, 0);
  std::vector<bool> floor(world, false);
  for (bool again = true; again;) {
    again = false;
    double left = double(batch), weight = 0;
    size_t free = 0;
    for (size_t r = 0; r < world; ++r) {
      if (floor[r])
        left -= double(least);
      else
        weight += std::max(weights[r], 0.0), ++free;
    }
    for (size_t r = 0; r < world; ++r) {
      if (floor[r]) continue;
      exact[r] = weight > 0 ? left * std::max(weights[r], 0.0) / weight : left / double(free);
      if (exact[r] < double(least)) floor[r] = again = true;
    }
  }
  std::vector<std::pair<double, size_t>> remainders;
  int64_t given = 0;
  for (size_t r = 0; r < world; ++r) {
    shares[r] = floor[r] ? least : static_cast<int64_t>(exact[r]);
    given += shares[r];
    remainders.emplace_back(floor[r] ? -1.0 : exact[r] - double(shares[r]), r);
  }
  // The items rounding left over: largest remainder first, ties to the lower rank, so every
  // rank decides alike.
  std::sort(remainders.begin(), remainders.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  for (size_t k = 0; given < batch; ++k, ++given) ++shares[remainders[k % world].second];
  return shares;
}

}  // namespace trainctl::data
