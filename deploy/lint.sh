#!/usr/bin/env bash
# Format and lint checks for C++ sources.
#
#   deploy/lint.sh [--all | --since REV] [--build-dir DIR] [--jobs N] [--report FILE]
#
# 1. clang-format (.clang-format) on every tracked C++ file: any file that
#    is not formatted fails the check (cheap: a second or two).
# 2. No bare ASSERT_TRUE(x.ok()) / EXPECT_TRUE(x.ok()) in any C++ file, and
#    no scratch directory in a test made other than by ScopedTempDir
#    (tests/testutil/temp_dir.h).
# 3. clang-tidy (.clang-tidy, with clang's -Wthread-safety) on the .cc files
#    changed since REV (default HEAD~1; --all: every file in the build's
#    compile_commands.json). A finding fails the check unless the file
#    already had at least that many findings of that check in
#    deploy/lint-baseline.txt ("<count> <check> <file>" lines, written by
#    --all --report): only new findings fail.
# The build directory (default build/test) must hold compile_commands.json,
# and generated headers must exist (build first). Exit status: 0 clean,
# 1 findings, 2 usage or tool errors.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=since rev=HEAD~1 build_dir=${KVTIER_BUILD_DIR:-build/test} jobs=$(nproc) report=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --all) mode=all; shift ;;
    --since) mode=since; rev="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --report) report="$2"; shift 2 ;;
    *) echo "lint: unknown argument $1" >&2; exit 2 ;;
  esac
done
for tool in clang-format clang-tidy; do
  command -v "$tool" >/dev/null || { echo "lint: $tool not installed (deploy/install-deps.sh)" >&2; exit 2; }
done
db="$build_dir/compile_commands.json"
[[ -f "$db" ]] || { echo "lint: $db missing: build first" >&2; exit 2; }

status=0
unformatted=$(git ls-files -z '*.cc' '*.h' '*.cu' '*.cuh' | xargs -0 clang-format --dry-run -Werror 2>&1 \
  | grep -oE '^[^ :]+:[0-9]+:[0-9]+: error' | cut -d: -f1 | sort -u || true)
if [[ -n "$unformatted" ]]; then
  echo "lint: not clang-formatted (run: clang-format -i <file>):"; echo "$unformatted" | sed 's/^/  /'
  status=1
else
  echo "lint: clang-format clean ($(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | wc -l) files)"
fi

# Bare status asserts: ASSERT_TRUE(x.ok()) / EXPECT_TRUE(x.ok()) print
# nothing when they fail; ASSERT_OK / EXPECT_OK (tests/testutil/
# status_matchers.h) print the status.
bare=$(git grep -nE '(ASSERT|EXPECT)_TRUE\([^;]*\.ok\(\)\)' -- '*.cc' '*.h' || true)
if [[ -n "$bare" ]]; then
  echo "lint: bare status asserts (use ASSERT_OK / EXPECT_OK from tests/testutil/status_matchers.h):"
  echo "$bare" | sed 's/^/  /'
  status=1
else
  echo "lint: no bare status asserts"
fi

# Scratch directories in tests: one way (tests/testutil/temp_dir.h). Fuzz
# targets, long-running processes, keep their own.
adhoc=$(git grep -nE 'mkdtemp\(|temp_directory_path\(|::testing::TempDir\(|"/tmp/kvtier-' \
  -- '*_test.cc' '*fixture*.h' '*test_util*.h' 'tests/**.h' 'tests/**.cc' \
  ':!tests/testutil/temp_dir.h' ':!tests/fuzz' || true)
if [[ -n "$adhoc" ]]; then
  echo "lint: scratch directories made by hand (use ScopedTempDir from tests/testutil/temp_dir.h):"
  echo "$adhoc" | sed 's/^/  /'
  status=1
else
  echo "lint: one way to make a test's scratch directory"
fi

# Sources clang-tidy can check: .cc files compiled in this build.
in_db=$(/usr/bin/python3 -c 'import json,os,sys
root=os.getcwd()+"/"
for e in json.load(open(sys.argv[1])):
  f=os.path.normpath(os.path.join(e["directory"],e["file"]))
  if f.startswith(root) and f.endswith(".cc") and "/build/" not in f[len(root)-1:]: print(f[len(root):])' "$db" | sort -u)
if [[ $mode == all ]]; then
  files="$in_db"
else
  if ! git rev-parse -q --verify "$rev^{commit}" >/dev/null; then
    echo "lint: no revision $rev: clang-tidy skipped"; exit $status
  fi
  changed=$(git diff --name-only "$rev" -- '*.cc' '*.h' | sort -u)
  # A changed header brings in the .cc file of the same name.
  changed=$(echo "$changed" | sed 's/\.h$/.cc/' | sort -u)
  files=$(comm -12 <(echo "$changed") <(echo "$in_db"))
fi
if [[ -z "$files" ]]; then echo "lint: no changed sources for clang-tidy"; exit $status; fi
echo "lint: clang-tidy on $(echo "$files" | wc -l) files, $jobs jobs"

out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
echo "$files" | xargs -P "$jobs" -I{} sh -c \
  'clang-tidy -p "$1" --quiet --extra-arg=-Wthread-safety --extra-arg=-Wno-unknown-warning-option "$2" \
     > "$3/$(echo "$2" | tr / _).log" 2>&1 || true' _ "$build_dir" {} "$out"
# "<file>:<line>:<col>: error: <message> [<check>,-warnings-as-errors]"
cat "$out"/*.log | grep -E '^[^ ]+:[0-9]+:[0-9]+: (error|warning): .*\[[a-z].*\]$' \
  | sed "s#^$PWD/##" | sort -u > "$out/findings" || true
awk '{ f=$1; sub(/:.*/, "", f); c=$NF; gsub(/\[|\]|,-warnings-as-errors/, "", c);
       n[c " " f]++ } END { for (k in n) print n[k], k }' "$out/findings" | sort -k3 > "$out/counts"
total=$(wc -l < "$out/findings")
echo "lint: clang-tidy findings: $total"
[[ -n "$report" ]] && cp "$out/counts" "$report"
new=0
while read -r count check file; do
  base=$(awk -v c="$check" -v f="$file" '$2==c && $3==f { print $1 }' deploy/lint-baseline.txt 2>/dev/null || true)
  if (( count > ${base:-0} )); then
    new=1; echo "lint: new: $file: $count x $check (baseline ${base:-0})"
    grep -F "$file:" "$out/findings" | grep -F "[$check" | sed 's/^/    /'
  fi
done < "$out/counts"
if [[ $mode == since && $new -ne 0 ]]; then status=1; fi
if [[ $mode == all ]]; then awk '{ print "  " $0 }' "$out/counts" | sort -rn | head -40; fi
exit $status
