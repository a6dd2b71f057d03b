#include "train/schedule.h"

#include <algorithm>
#include <cmath>

namespace trainctl::train {

double LearningRate(const OptimizerSpec& o, const ScheduleSpec& s, int64_t step, int64_t total_steps, int world_size) {
  double base = o.lr * (s.scale_by_world_size ? world_size : 1);
  if (s.name == "one_cycle") {
    // The rise takes warmup_steps, else 30 % of the steps (OneCycleLR's pct_start).
    const int64_t up = std::max<int64_t>(1, s.warmup_steps > 0 ? s.warmup_steps : int64_t(0.3 * double(total_steps)));
    const double start = base / 25;  // OneCycleLR's div_factor
    if (step < up) return start + (base - start) * 0.5 * (1 - std::cos(M_PI * double(step) / double(up)));
    const double progress = std::min(1.0, double(step - up) / double(std::max<int64_t>(1, total_steps - up)));
    const double floor = std::min(s.min_lr, base);
    return floor + (base - floor) * 0.5 * (1 + std::cos(M_PI * progress));
  }
  if (step < s.warmup_steps) return base * double(step + 1) / double(s.warmup_steps);
  int64_t t = step - s.warmup_steps;
  int64_t span = std::max<int64_t>(1, total_steps - s.warmup_steps);
  if (s.name == "step") return base * std::pow(s.gamma, double(t / std::max<int64_t>(1, s.step_size)));
  if (s.name == "cosine") {
    double progress = std::min(1.0, double(t) / double(span));
    double floor = std::min(s.min_lr, base);
    return floor + (base - floor) * 0.5 * (1 + std::cos(M_PI * progress));
  }
  return base;
}

}  // namespace trainctl::train
