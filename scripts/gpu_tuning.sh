#!/usr/bin/env bash
# The tuning table on a GPU machine (the mechanism; one GPU is enough, the timings are not the
# point):
#   1. `ferrocomm info` names this machine's table by GPU model, count and links
#      (XDG_CACHE_HOME/ferrocomm/tuning/cuda-<model>-x<count>-<links>.json) and shows the
#      built-in table in force;
#   2. the bench's algo column on the cuda backend (one rank, CUDA graphs) without a table and
#      with FERROCOMM_TUNING naming one whose all-reduce pushes up to 4 KiB only (built in: 64
#      KiB): the plan must change at exactly 8 KiB and 16 KiB (push -> flat) and nowhere else;
#   3. the same table as this machine's file (no FERROCOMM_TUNING): the same change.
#
#   scripts/gpu_tuning.sh BUILD_DIR OUT_DIR
# OUT_DIR/tuning.txt holds every output; the exit status is non-zero when a check fails.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/gpu_tuning.sh BUILD_DIR OUT_DIR" >&2; exit 2; }
build="$(cd "$1" && pwd)" || exit 2
mkdir -p "$2" && res="$(cd "$2" && pwd)" || exit 2
fc="$build/bin/ferrocomm"
[ -x "$fc" ] || { echo "no ferrocomm in $build/bin (scripts/gpu_prepare.sh BUILD_DIR)" >&2; exit 2; }
export XDG_CACHE_HOME="$res/cache"
unset FERROCOMM_TUNING RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
log="$res/tuning.txt"
: > "$log"
failed=0
fail() { echo "FAIL: $*" | tee -a "$log"; failed=1; }

"$fc" info > "$res/info.txt" 2>&1 || fail "ferrocomm info"
sed -n '/== Tuning table/,/^$/p' "$res/info.txt" | tee -a "$log"
grep -q "^in force: built in " "$res/info.txt" || fail "info: the built-in table in force"
machine="$(sed -n "s|^this machine's table: \(.*\.json\) (.*|\1|p" "$res/info.txt")"
case "$machine" in
  "$XDG_CACHE_HOME"/ferrocomm/tuning/cuda-*-x[0-9]*-*.json) echo "machine table: $machine" | tee -a "$log" ;;
  *) fail "info: this machine's table named by model, count and links, got '$machine'" ;;
esac

# A whole table: every world pushes up to 4 KiB, flat to 32 MiB, NCCL above.
table="$res/table.json"
cat > "$table" <<'EOF'
{
  "format": 1,
  "machine": "scripts/gpu_tuning.sh",
  "all_reduce": [
    {"worlds": "1-", "push_max": "4K", "flat_max": "32M", "tree_max": "32M", "measured": "a check"}
  ],
  "direct_max": [],
  "low_precision": {"cuda_min_bytes": "4M", "measured": "a check"},
  "pipelined": {"round_bytes": "4M", "min_part_bytes": {}, "measured": "a check"}
}
EOF
chmod 600 "$table"

# size -> algo column of one bench run (graph mode, one rank on GPU 0).
algos() {
  "$@" bench all_reduce -g 1 -b 1K -e 16K -f 2 -n 5 -w 2 -G 10 -c 1 2>&1 | tee -a "$log" |
    awk '!/^#/ && NF > 6 && $1 ~ /^[0-9]+$/ {print $1, $NF}'
}
echo "== built in" | tee -a "$log"
built="$(algos "$fc")"
echo "== FERROCOMM_TUNING=$table" | tee -a "$log"
named="$(algos env FERROCOMM_TUNING="$table" "$fc")"
mkdir -p "$(dirname "$machine")" && cp "$table" "$machine" && chmod 600 "$machine"
echo "== this machine's table $machine" | tee -a "$log"
mine="$(algos "$fc")"
"$fc" info > "$res/info-machine.txt" 2>&1
grep -q "^in force: this machine's table $machine" "$res/info-machine.txt" ||
  fail "info: this machine's table in force once written"
printf 'size built-in FERROCOMM_TUNING machine\n%s\n' \
  "$(join <(echo "$built") <(echo "$named") | join - <(echo "$mine"))" | tee -a "$log"
for size in 1024 2048 4096 8192 16384; do
  b="$(echo "$built" | awk -v s=$size '$1 == s {print $2}')"
  n="$(echo "$named" | awk -v s=$size '$1 == s {print $2}')"
  m="$(echo "$mine" | awk -v s=$size '$1 == s {print $2}')"
  if [ "$size" -le 4096 ]; then want="$b"; else want=flat; fi
  [ "$b" = push ] || fail "$size bytes built in: push expected, got '$b'"
  [ "$n" = "$want" ] || fail "$size bytes with FERROCOMM_TUNING: '$want' expected, got '$n'"
  [ "$m" = "$want" ] || fail "$size bytes with this machine's table: '$want' expected, got '$m'"
done
[ "$failed" = 0 ] && echo "every tuning check passed" | tee -a "$log"
exit "$failed"
