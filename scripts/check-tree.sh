#!/usr/bin/env bash
# Fails when the repository in the current directory tracks build output:
# an executable binary (ELF, Mach-O, PE or WebAssembly, whatever its mode),
# a file with the executable bit that is not a script (no "#!" line), or
# any file over 1 MiB. Files under a testdata directory are not checked
# (they are the tests' data). Each other exception is a line of
# .ci/tree-exceptions: the path, then why it is tracked; an exception
# without a reason, or for a path that is not tracked, is an error too.
# CI runs it (.ci/run); `make check-tree` too.
set -euo pipefail

limit=$((1 << 20))
exceptions=.ci/tree-exceptions

declare -A allowed=()
bad=()
if [ -f "$exceptions" ]; then
	while IFS= read -r line || [ -n "$line" ]; do
		case "$line" in '' | '#'*) continue ;; esac
		read -r path reason <<<"$line"
		if [ -z "$reason" ]; then
			bad+=("$exceptions: $path is excepted without a reason")
		elif [ -z "$(git ls-files -- "$path")" ]; then
			bad+=("$exceptions: $path is not tracked: remove its line")
		fi
		allowed[$path]=1
	done <"$exceptions"
fi

# Each tracked file's mode and object, its object's size, and whether git
# sees binary content in it (i/-text): one git command each, for all files.
declare -A mode=() object=() size=() binary=()
while IFS= read -r -d '' entry; do
	path=${entry#*$'\t'}
	read -r m o _ <<<"${entry%%$'\t'*}"
	mode[$path]=$m
	object[$path]=$o
done < <(git ls-files -s -z)
while read -r o s; do
	size[$o]=$s
done < <(printf '%s\n' "${object[@]}" | git cat-file --batch-check='%(objectname) %(objectsize)')
while IFS= read -r -d '' entry; do
	[[ $entry == i/-text* ]] && binary[${entry#*$'\t'}]=1
done < <(git ls-files --eol -z)

for path in "${!mode[@]}"; do
	case "/$path" in */testdata/*) continue ;; esac
	[ -n "${allowed[$path]:-}" ] && continue
	[ "${mode[$path]}" = 160000 ] && continue # a submodule: not a file
	what=""
	if [ -n "${binary[$path]:-}" ] || [ "${mode[$path]}" = 100755 ]; then
		magic=$(set +o pipefail; git cat-file blob "${object[$path]}" | head -c 4 | od -An -tx1 | tr -d ' \n')
		case "$magic" in
		7f454c46) what="an ELF executable or library" ;;
		feedface | feedfacf | cefaedfe | cffaedfe | cafebabe) what="a Mach-O binary" ;;
		4d5a*) what="a PE (Windows) binary" ;;
		0061736d) what="a WebAssembly binary" ;;
		2321*) ;; # a script
		*) [ "${mode[$path]}" = 100755 ] && what="executable (mode 755) but not a script (no #! line)" ;;
		esac
	fi
	[ -n "$what" ] && bad+=("$path: $what")
	if [ "${size[${object[$path]}]}" -gt "$limit" ]; then
		bad+=("$path: ${size[${object[$path]}]} bytes, over 1 MiB")
	fi
done

if [ ${#bad[@]} -gt 0 ]; then
	echo "the repository tracks what it should not (build output belongs in .gitignore; a file that must be tracked goes in $exceptions with its reason):" >&2
	printf '  %s\n' "${bad[@]}" | sort >&2
	exit 1
fi
