// The dashboard's page, script and style sheet (src/monitor/assets/), compiled into the binary by
// CMake: the dashboard needs no files and nothing from the network.
#pragma once

namespace trainctl::monitor {

extern const char* const kDashboardHtml;
extern const char* const kDashboardJs;
extern const char* const kDashboardCss;

}  // namespace trainctl::monitor
