#!/usr/bin/env bash
# Fuzzes every fuzz target of the packages PKGS (default ./...: the module
# from the current directory), as `go test -list` finds them, for FUZZTIME
# each (a duration, or Nx for N inputs); FUZZ, a regular expression, keeps
# the targets whose names match. `make fuzz` runs it.
#
# A target fails the run when it writes a crasher: a new file under its
# package's testdata/fuzz/<target>/, named in the summary with the command
# that replays it. Go 1.26's fuzzing coordinator can also fail a target on
# its own -fuzztime deadline, having found nothing: a bare "context deadline
# exceeded" and no input written (golang/go#75804, fixed in Go 1.27). That
# is reported and not counted as a failure. Any other failure that wrote no
# crasher (a build error, a seed corpus entry that fails) fails the run.
set -uo pipefail

GO=${GO:-go}
FUZZTIME=${FUZZTIME:-20s}
FUZZ=${FUZZ:-.}
read -r -a pkgs <<<"${PKGS:-./...}"

if ! list=$("$GO" test -list '^Fuzz' "${pkgs[@]}" 2>&1); then
	printf '%s\n' "$list" >&2
	echo "fuzz: cannot list the fuzz targets" >&2
	exit 1
fi
targets=()
names=()
while IFS= read -r line; do
	case "$line" in
	Fuzz*) names+=("$line") ;;
	ok*)
		pkg=$(awk '{print $2}' <<<"$line")
		for n in "${names[@]}"; do
			if [[ $n =~ $FUZZ ]]; then targets+=("$pkg $n"); fi
		done
		names=()
		;;
	esac
done <<<"$list"
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no fuzz target matches FUZZ=$FUZZ" >&2
	exit 1
fi

# coordinator_race reports whether the output of fuzzing target $1, in
# file $2, is the coordinator's own deadline failure: the target failed with
# the bare "context deadline exceeded" as its only line, no subtest failed,
# and no input was written.
coordinator_race() {
	awk -v fn="$1" '
		index($0, "--- FAIL: " fn "/") == 1 || /Failing input written to|failure while testing seed corpus/ { other = 1 }
		prev && $0 == "    context deadline exceeded" { race = 1 }
		{ prev = index($0, "--- FAIL: " fn " (") == 1 }
		END { exit !(race && !other) }
	' "$2"
}

out=$(mktemp)
trap 'rm -f "$out"' EXIT
crashers=()
failed=()
raced=()
for t in "${targets[@]}"; do
	read -r pkg fn <<<"$t"
	echo "== $fn ($pkg, $FUZZTIME)"
	dir=$("$GO" list -f '{{.Dir}}' "$pkg") || { failed+=("$fn ($pkg): go list failed"); continue; }
	corpus="$dir/testdata/fuzz/$fn"
	before=$(ls -1 "$corpus" 2>/dev/null | sort)
	"$GO" test -run '^$' -fuzz "^$fn\$" -fuzztime "$FUZZTIME" "$pkg" 2>&1 | tee "$out"
	rc=${PIPESTATUS[0]}
	[ "$rc" -eq 0 ] && continue
	after=$(ls -1 "$corpus" 2>/dev/null | sort)
	written=$(comm -13 <(printf '%s\n' "$before") <(printf '%s\n' "$after") | grep -v '^$')
	if [ -n "$written" ]; then
		while IFS= read -r f; do
			crashers+=("$corpus/$f  (replay: $GO test -run '^$fn/$f\$' $pkg)")
		done <<<"$written"
	elif coordinator_race "$fn" "$out"; then
		raced+=("$fn ($pkg)")
		echo "== $fn: the fuzzing coordinator failed on its own -fuzztime deadline with no input written (golang/go#75804): not a crash"
	else
		failed+=("$fn ($pkg): failed without writing a crasher (exit $rc; its output is above)")
	fi
done

echo
echo "fuzz: ${#targets[@]} targets, $FUZZTIME each: ${#crashers[@]} crashers written, ${#failed[@]} other failures, ${#raced[@]} coordinator deadline races (not failures)"
for c in "${crashers[@]}"; do echo "  crasher: $c"; done
for f in "${failed[@]}"; do echo "  failed:  $f"; done
for r in "${raced[@]}"; do echo "  race:    $r"; done
[ ${#crashers[@]} -eq 0 ] && [ ${#failed[@]} -eq 0 ]
