#include "client/kvtierctl/progress.h"

#include <cstdio>

namespace kvtier::ctl {

std::string RenderBar(uint64_t done, uint64_t total, int width) {
  int filled = total == 0 ? width : static_cast<int>(done * width / total);
  if (filled > width) filled = width;
  return "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
}

ProgressBar::ProgressBar(std::ostream& out, bool is_terminal, std::string unit)
    : out_(out), is_terminal_(is_terminal), unit_(std::move(unit)) {}

void ProgressBar::Update(uint64_t done, uint64_t total, const std::string& suffix) {
  int percent = total == 0 ? 100 : static_cast<int>(done * 100 / total);
  char line[160];
  std::snprintf(line, sizeof(line), "%s %llu/%llu %s %3d%%%s%s", RenderBar(done, total, 30).c_str(),
                static_cast<unsigned long long>(done), static_cast<unsigned long long>(total),
                unit_.c_str(), percent, suffix.empty() ? "" : "  ", suffix.c_str());
  if (is_terminal_) {
    out_ << "\r" << line << std::flush;
    drawn_ = true;
    return;
  }
  int decile = percent / 10;
  if (decile == last_decile_) return;
  last_decile_ = decile;
  out_ << line << "\n";
}

void ProgressBar::Finish() {
  if (is_terminal_ && drawn_) out_ << "\n";
}

}  // namespace kvtier::ctl
