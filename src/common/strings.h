// Small string helpers shared by the spec and the CLI.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace trainctl {

// Levenshtein distance, for did-you-mean suggestions.
size_t EditDistance(std::string_view a, std::string_view b);
// The closest candidate within a distance that grows with the word's length; "" if none is close.
std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates);
// A line of a program's output made safe to show on a terminal: control bytes (escape sequences
// that move the cursor, clear the screen, set the title or the clipboard, BEL, backspace) shown as
// text ("^[", "^G"); with `keep_colors`, colour and style sequences (ESC [ ... m) pass unchanged.
std::string SafeForTerminal(std::string_view line, bool keep_colors);
// The shortest text that reads back as exactly `v` (0.05, not 0.050000000000000003); inf and nan
// as Prometheus and Go write them: +Inf, -Inf, NaN.
std::string ShortestNumber(double v);
std::string Join(const std::vector<std::string>& parts, std::string_view sep);
// Shows a user-given value inside an error: quoted, control bytes escaped, cut at 60 chars.
std::string Quote(std::string_view value);
// Splits on `sep`, dropping a final empty piece.
std::vector<std::string> Split(std::string_view text, char sep);
// Splits on '\n', dropping a final empty piece.
std::vector<std::string> SplitLines(std::string_view text);
// a == b, in a time that depends only on the lengths (for comparing secrets such as tokens).
bool ConstantTimeEquals(std::string_view a, std::string_view b);
// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool IsValidUtf8(std::string_view text);

}  // namespace trainctl
