#!/usr/bin/env bash
# The tuning table on a GPU machine (the mechanism; one GPU is enough, the timings are not the
# point):
#   1. `ferrocomm info` names this machine's table by GPU model, count and links
#      (XDG_CACHE_HOME/ferrocomm/tuning/cuda-<model>-x<count>-<links>.json) and shows the
#      built-in table in force;
#   2. the bench's algo column on the cuda backend (one rank, CUDA graphs) without a table and
#      with FERROCOMM_TUNING naming one whose all-reduce pushes up to 4 KiB only (built in: 64
#      KiB): the plan must change at exactly 8 KiB and 16 KiB (push -> flat) and nowhere else;
#   3. the same table as this machine's file (no FERROCOMM_TUNING): the same change;
#   4. the limits the table holds for the executors, moved: the built-in table with its LL
#      part limit at 4 KiB (built in: 256 KiB) and the wide low-precision kernel from 1 MiB
#      chunks (built in: 32 MiB); two ranks (sharing the GPU where there is one: NCCL left out)
#      run gpu_check_coll --quick and gpu_check_lowp --quick --no-timing under it with
#      FERROCOMM_DEBUG=1: every result must check, and every plan printed (each the first time
#      it comes up on a communicator) must put a
#      staged collective's parts (the all-to-all's aside) in LL lines exactly up to 4096 bytes
#      and a one-launch
#      low-precision call on the wide kernel exactly from 1048576 bytes per part (both sides
#      of each limit seen, and some between the moved and the built-in limit), the two-shot
#      all-reduce never.
#
#   scripts/gpu_tuning.sh BUILD_DIR OUT_DIR
# OUT_DIR/tuning.txt holds every output; the exit status is non-zero when a check fails.
set -uo pipefail
. "$(dirname "$0")/gpu_args.sh"
gpu_dirs res "usage: scripts/gpu_tuning.sh BUILD_DIR OUT_DIR" "$@" || exit 2
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
# 4. The moved limits, run by the executors as the plan says.
gpu_env
moved="$res/moved.json"
sed -e 's/"max_part_bytes": "256K"/"max_part_bytes": "4K"/' \
    -e 's/"wide_min_bytes": "32M"/"wide_min_bytes": "1M"/' \
    "$(dirname "$0")/../crates/ferrocomm/src/config/tuning.json" > "$moved"
chmod 600 "$moved"
grep -q '"max_part_bytes": "4K"' "$moved" && grep -q '"wide_min_bytes": "1M"' "$moved" ||
  fail "the moved table: the built-in table's LL and wide limits not found"
ngpu="$(nvidia-smi -L 2>/dev/null | wc -l)"
share=()
[ "$ngpu" -ge 2 ] || share=(--share-gpus)
for prog in gpu_check_coll gpu_check_lowp; do
  flags=(--quick)
  [ "$prog" = gpu_check_lowp ] && flags+=(--no-timing)
  [ -x "$build/bin/$prog" ] || { fail "no $prog in $build/bin"; continue; }
  echo "== $prog under $moved (FERROCOMM_DEBUG=1)" | tee -a "$log"
  FERROCOMM_TUNING="$moved" FERROCOMM_DEBUG=1 FERROCOMM_TIMEOUT_S="${FERROCOMM_TIMEOUT_S:-30}" \
    "$fc" launch -n 2 --timeout 560 -- "$build/bin/$prog" "${flags[@]}" "${share[@]}" \
    > "$res/moved-$prog.log" 2>&1 || fail "$prog under the moved table (see moved-$prog.log)"
  tail -n 5 "$res/moved-$prog.log" | tee -a "$log"
done
# The plans printed: "<coll> of <B> bytes per rank (<dtype>) runs <path> (<detail>)".
awk -v out="$log" '
  / runs / && match($0, /: [a-z_]+ of [0-9]+ bytes per rank/) {
    split(substr($0, RSTART + 2, RLENGTH - 2), w, " "); coll = w[1]; b = w[3] + 0
    # The all-to-all counts its whole output: its parts are half of it at two ranks.
    if (coll != "all_to_all" && $0 ~ /\(parts /) {
      ll = ($0 ~ /\(parts ll/)
      if (ll && b > 4096) { print "FAIL: LL above 4096: " $0 >> out; bad = 1 }
      if (!ll && b <= 4096) { print "FAIL: staged at most 4096: " $0 >> out; bad = 1 }
      if (ll) n_ll++; else n_st++
      # Staged where the built-in limit (256 KiB) had LL: the moved limit is the one run.
      if (!ll && b <= 262144) n_moved_st++
    }
    if ($0 ~ /runs lp-tree/ && $0 ~ /wide/) { print "FAIL: a wide two-shot: " $0 >> out; bad = 1 }
    if ($0 ~ /runs lp-(flat|direct) / && coll ~ /^(all_reduce|all_gather|reduce_scatter)$/ \
        && b <= 16777216 && match($0, /the last [a-z]+/)) {
      wide = (substr($0, RSTART + 9, RLENGTH - 9) == "wide")
      if (wide && b < 1048576) { print "FAIL: wide below 1 MiB: " $0 >> out; bad = 1 }
      if (!wide && b >= 1048576) { print "FAIL: plain from 1 MiB: " $0 >> out; bad = 1 }
      if (wide) n_wide++; else n_plain++
      # Wide where the built-in size (32 MiB) had the plain kernel.
      if (wide && b < 33554432) n_moved_wide++
    }
  }
  END {
    printf "plans printed: %d LL, %d staged, %d wide, %d plain low-precision launches\n", \
      n_ll, n_st, n_wide, n_plain >> out
    if (!n_ll || !n_st || !n_wide || !n_plain) { print "FAIL: a limit not seen from both sides" >> out; bad = 1 }
    if (!n_moved_st || !n_moved_wide) { print "FAIL: no plan printed where only the moved limits differ from the built-in ones" >> out; bad = 1 }
    exit bad
  }' "$res"/moved-gpu_check_coll.log "$res"/moved-gpu_check_lowp.log ||
  { failed=1; echo "FAIL: the plans printed under the moved table (above)"; }
tail -n 3 "$log"
[ "$failed" = 0 ] && echo "every tuning check passed" | tee -a "$log"
exit "$failed"
