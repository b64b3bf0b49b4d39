#!/usr/bin/env bash
# Compares two servers as a client sees them: each run starts a server
# afresh, waits for its socket, runs the client once against it and stops
# it; the two servers take turns, A B then B A, for N pairs. The client
# prints "name value" lines (`umbp bench -suite`, or any client that prints
# the same, such as the C++ umbp_bench of docs/PERFORMANCE.md). For every
# row: the median of A and of B over the runs, and the median of the pairs'
# ratios B ÷ A with their range (a row's ratio is taken within a pair, so
# that the host's drift from pair to pair cancels).
#
#   scripts/server-pair.sh -n 4 \
#     -a 'bin/umbp-standalone-server -endpoint unix://@SOCK@ -capacity 1GiB' \
#     -b '/path/to/other-server unix://@SOCK@' \
#     -c 'bin/umbp bench -suite -yes -endpoint unix://@SOCK@'
#
# @SOCK@ is the gRPC socket, in a fresh directory of mode 0700 for each run.
# OUT=dir keeps each run's client output and server log there. A server
# prints nothing it must: the script waits for the socket file to appear
# (at most WAIT seconds, default 60) and for the client's own start-up
# wait (umbp's -timeout) to see it answer.
#
# -d CLIENT runs B's runs with that client instead of -c's, so that two
# builds of the whole path (client and server) can be compared, each on
# fresh servers:
#
#   scripts/server-pair.sh -n 8 \
#     -a 'old/umbp-standalone-server -endpoint unix://@SOCK@ -capacity 1GiB' \
#     -b 'bin/umbp-standalone-server -endpoint unix://@SOCK@ -capacity 1GiB' \
#     -c 'old/umbp bench -suite -yes -endpoint unix://@SOCK@' \
#     -d 'bin/umbp bench -suite -yes -endpoint unix://@SOCK@'
set -u
n=4 a= b= c= d=
while getopts n:a:b:c:d: opt; do
  case $opt in
  n) n=$OPTARG ;;
  a) a=$OPTARG ;;
  b) b=$OPTARG ;;
  c) c=$OPTARG ;;
  d) d=$OPTARG ;;
  *) exit 2 ;;
  esac
done
if [ -z "$a" ] || [ -z "$b" ] || [ -z "$c" ]; then
  sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
case $n in
'' | *[!0-9]* | 0)
  echo "server-pair: -n $n: want the number of pairs, 1 or more" >&2
  exit 2
  ;;
esac
for cmd in "$a" "$b"; do
  if [[ $cmd != *@SOCK@* ]]; then
    echo "server-pair: '$cmd' does not name @SOCK@: the server would listen where the client does not look" >&2
    exit 2
  fi
done
declare -A client=([A]=$c [B]=${d:-$c})
out=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/server-pair.XXXXXX")}
mkdir -p "$out"
wait_s=${WAIT:-60}

# run LABEL SERVERCMD: one fresh server, one client run; the client's rows
# go to $out/LABEL.K (K counts that server's runs).
# The server of the run in progress, and its directory: stopped and
# removed if the script ends during the run.
declare -A count=([A]=0 [B]=0)
pid= dir=
trap 'if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; fi; if [ -n "$dir" ]; then rm -rf "$dir"; fi' EXIT
trap 'exit 130' INT TERM
run() {
  local label=$1 cmd=$2 sock k
  dir=$(mktemp -d "${TMPDIR:-/tmp}/sp.XXXXXX")
  chmod 700 "$dir"
  sock=$dir/node0.grpc.sock
  k=$((count[$label] + 1))
  count[$label]=$k
  : >"$out/$label.$k.log" # both write by appending, so neither overwrites the other
  ${cmd//@SOCK@/$sock} >>"$out/$label.$k.log" 2>&1 &
  pid=$!
  for _ in $(seq $((wait_s * 10))); do
    [ -S "$sock" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  local cl=${client[$label]}
  if ! ${cl//@SOCK@/$sock} >"$out/$label.$k" 2>>"$out/$label.$k.log"; then
    echo "server-pair: the client failed against $label (run $k): $out/$label.$k.log" >&2
  fi
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  rm -rf "$dir"
  pid= dir=
}

for i in $(seq 1 "$n"); do
  if [ $((i % 2)) -eq 1 ]; then
    run A "$a"
    run B "$b"
  else
    run B "$b"
    run A "$a"
  fi
  echo "server-pair: pair $i of $n done" >&2
done

# Rows: name, median A, median B, median of B/A over pairs (min–max).
awk -v n="$n" '
function median(arr, m,   i, j, t, s) {
  for (i = 1; i <= m; i++) s[i] = arr[i]
  for (i = 2; i <= m; i++) for (j = i; j > 1 && s[j-1] > s[j]; j--) { t = s[j]; s[j] = s[j-1]; s[j-1] = t }
  return m % 2 ? s[(m+1)/2] : (s[m/2] + s[m/2+1]) / 2
}
FNR == 1 { split(FILENAME, p, "/"); f = p[length(p)]; split(f, q, "."); side = q[1]; run = q[2] }
NF == 2 && $2 ~ /^[0-9.]+$/ {
  if (!($1 in seen)) { seen[$1] = 1; order[++rows] = $1 }
  v[$1, side, run] = $2
}
END {
  printf "%-32s %10s %10s %8s  %s\n", "row", "A", "B", "B/A", "(range over pairs)"
  for (r = 1; r <= rows; r++) {
    name = order[r]; ma = 0; mb = 0; mr = 0
    delete xa; delete xb; delete xr
    lo = ""; hi = ""
    for (k = 1; k <= n; k++) {
      if ((name, "A", k) in v) xa[++ma] = v[name, "A", k]
      if ((name, "B", k) in v) xb[++mb] = v[name, "B", k]
      if ((name, "A", k) in v && (name, "B", k) in v && v[name, "A", k] > 0) {
        x = v[name, "B", k] / v[name, "A", k]; xr[++mr] = x
        if (lo == "" || x < lo) lo = x
        if (hi == "" || x > hi) hi = x
      }
    }
    if (ma == 0 || mb == 0 || mr == 0) continue
    printf "%-32s %10.2f %10.2f %8.3f  (%.3f–%.3f)\n", name, median(xa, ma), median(xb, mb), median(xr, mr), lo, hi
  }
}' $(for k in $(seq 1 "$n"); do echo "$out/A.$k" "$out/B.$k"; done)
echo "server-pair: runs kept in $out" >&2
