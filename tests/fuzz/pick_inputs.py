#!/usr/bin/env python3
"""Picks the inputs worth keeping after a fuzz run.

usage: pick_inputs.py CONTROL_FILE K

CONTROL_FILE is the -merge_control_file of a libFuzzer `-merge=1 OUT SEEDS
NEW...` run whose first directory OUT held the kept corpus. Prints up to K
of the other files, chosen greedily: each adds the most features that the
kept corpus and the files chosen before it do not have.
"""
import collections
import sys


def main():
    control, k = sys.argv[1], int(sys.argv[2])
    lines = open(control).read().split("\n")
    count, kept = int(lines[0]), int(lines[1])
    files = lines[2:2 + count]
    features = collections.defaultdict(set)
    for line in lines[2 + count:]:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "FT":
            features[int(parts[1])] = set(map(int, parts[2:]))
    have = set().union(*(features[i] for i in range(kept)))
    candidates = set(range(kept, count))
    for _ in range(k):
        best = max(candidates, key=lambda i: (len(features[i] - have), -i), default=None)
        if best is None or not features[best] - have:
            break
        print(files[best])
        have |= features[best]
        candidates.discard(best)


if __name__ == "__main__":
    main()
