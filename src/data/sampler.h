// DistributedSampler: which items each rank reads in an epoch. All ranks share a seed, so they
// agree on one permutation per epoch without talking; rank r takes items r, r+W, r+2W, ... of it.
// Every rank gets the same number of items (the permutation is padded by wrapping around, as
// PyTorch's DistributedSampler does, or cut with drop_last), so no rank waits in a collective.
#pragma once

#include <cstdint>
#include <vector>

namespace trainctl::data {

struct SamplerOptions {
  int rank = 0;
  int world_size = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;  // true: drop the tail instead of padding
};

// Items per rank in an epoch of `n` items.
int64_t ShardSize(int64_t n, const SamplerOptions& options);
// This rank's item indices for `epoch`, in the order to read them.
std::vector<int64_t> ShardIndices(int64_t n, int64_t epoch, const SamplerOptions& options);
// The permutation of all n items that every rank's shard of `epoch` is cut from (rank r's k-th
// item is its item r + k x world_size). Step s of a per-rank batch b reads its global batch from
// items [s b W, (s + 1) b W) of it, whichever rank reads which of them.
std::vector<int64_t> EpochOrder(int64_t n, int64_t epoch, const SamplerOptions& options);

// trainer.balance: speed: how many of a global batch of `batch` items each rank reads next, in
// proportion to `weights` (one per rank, >= 0; all 0: evenly), every rank at least `least`. The
// shares sum to `batch` (the largest remainders get the items rounding leaves; ties to the lower
// rank), so every rank that computes the same weights from the same allreduced bits gets the
// same shares.
std::vector<int64_t> SplitBatch(const std::vector<double>& weights, int64_t batch, int64_t least);

}  // namespace trainctl::data
