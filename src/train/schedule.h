// Learning-rate schedules: constant, step decay and cosine, each with an optional linear warm-up,
// and one-cycle (a cosine rise from lr/25 to lr, then a cosine fall to min_lr: PyTorch's
// OneCycleLR with its defaults); the linear scaling rule (lr x world size) applies to all.
// No torch: plain arithmetic, unit tested.
#pragma once

#include <cstdint>

#include "jobspec/job_spec.h"

namespace trainctl::train {

// The learning rate for optimizer step `step` (0-based) of `total_steps`.
double LearningRate(const OptimizerSpec& optimizer, const ScheduleSpec& schedule, int64_t step, int64_t total_steps,
                    int world_size);

}  // namespace trainctl::train
