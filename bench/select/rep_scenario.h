// kvtier_select_bench --scenario reps: which per-page representative of a
// retrieval head's keys ranks the pages that hold its attention, measured
// rather than assumed (the ranking pass of "Selection whose cost follows
// the budget").
//
// On the 7B-class shape of `long` (long_scenario.h: the copy model's real
// keys re-rotated into 16K and 128K-token contexts, 8 retrieval heads on 4
// key heads, head_dim 128), for 32 consecutive decode steps, per head: the
// exact share of its attention on each block of 16 tokens (float keys),
// and each representative's score of each block. Blocks always read (the
// first and the last 32) are left out of both. Reported per representative:
// bytes per block and head at int8 (against the block's 2,048 key bytes),
// and the recall at the top 1%, 2%, 5% and 10% of the blocks of
//   targets   blocks holding >= head_min_mass (0.4) of the head's attention
//             (the blocks the mass scorer gives a retrieval term)
//   strong    blocks holding >= 5%
//   mass      the share of the attention outside the always-read blocks
//             that the top blocks hold
//
// Representatives (s = softmax scale, q the query, T = 16 tokens):
//   mean          log T + s q.mean
//   halves        logsumexp over two 8-token halves of log 8 + s q.mean_half
//   top           s q.k of the block's largest-norm key
//   mean|top      the larger of mean and top
//   halves|top    the larger of halves and top
//   quest         log T + s sum_d max(q_d max_d, q_d min_d) (Quest's bound)
//   shipped       the mass tree's page screen: max(log T + m + 0.25 (u - m),
//                 top), m the mean term, u the quest term
//   channels16/32 the exact log-sum-exp over the block's tokens on the 16
//                 (32) channels with the largest mean |q_d| x mean |k_d|
//                 over this context and these steps (Loki / Double
//                 Sparsity; calibrated on the data it is judged on, so an
//                 upper bound)
#ifndef KVTIER_BENCH_SELECT_REP_SCENARIO_H_
#define KVTIER_BENCH_SELECT_REP_SCENARIO_H_

#include <string>

#include "bench/select/long_scenario.h"

namespace kvtier::bench {

// Prints the table, writes OUT_DIR/select_reps.csv and select_reps.md.
// options.quick: 128K only. False (after a message) when the dumps cannot
// be read.
bool RunRepScenario(const LongScenarioOptions& options, const std::string& out_dir);

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_SELECT_REP_SCENARIO_H_
