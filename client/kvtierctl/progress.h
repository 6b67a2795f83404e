// A one-line terminal progress bar for long kvtierctl operations.
//   [##########..........]  512/1024 blocks  50%  3 corrupt
// Redraws in place on a terminal (\r); prints a line per update otherwise
// at most every 10%, so logs stay short.
#ifndef KVTIER_CLIENT_KVTIERCTL_PROGRESS_H_
#define KVTIER_CLIENT_KVTIERCTL_PROGRESS_H_

#include <cstdint>
#include <ostream>
#include <string>

namespace kvtier::ctl {

class ProgressBar {
 public:
  ProgressBar(std::ostream& out, bool is_terminal, std::string unit);
  void Update(uint64_t done, uint64_t total, const std::string& suffix = "");
  void Finish();

 private:
  std::ostream& out_;
  const bool is_terminal_;
  const std::string unit_;
  int last_decile_ = -1;
  bool drawn_ = false;
};

// "[#####.....]" of width cells for done/total (an empty total is full).
std::string RenderBar(uint64_t done, uint64_t total, int width);

}  // namespace kvtier::ctl

#endif  // KVTIER_CLIENT_KVTIERCTL_PROGRESS_H_
