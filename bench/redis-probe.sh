#!/usr/bin/env bash
# redis-probe.sh: where a decision's time goes inside Redis, by elimination
# (docs/performance.md). Starts its own redis-server on a free loopback port,
# loads the probe library (benchtool probelib: the production library plus
# functions that each do a prefix of the decision), and runs each function
# with redis-benchmark (-P 16, so the network costs little per call). Prints
# two Markdown tables, each the median over the rounds per function and case:
# Redis's main thread CPU per call (INFO cpu, used_cpu_*_main_thread, over
# the calls of INFO commandstats), which a busy machine does not inflate, and
# Redis's own time per call (usec_per_call of FCALL), which counts the time
# Redis waited for a core inside the call too.
#
#   bash bench/redis-probe.sh                       # every function, every case
#   PROBE_FNS="p_empty take" PROBE_ROUNDS=5 bash bench/redis-probe.sh
#   PROBE_LIBS="/tmp/a.lua /tmp/b.lua" ...          # compare libraries (files
#                                                   # printed by benchtool probelib)
#   PROBE_CALLGRIND=1 bash bench/redis-probe.sh     # instructions per call instead
#
# PROBE_CALLGRIND=1 runs redis-server under valgrind's callgrind and prints
# one table: the instructions Redis executed per call (its whole process:
# reading the call, the function, the reply), which the machine's load does
# not change, so a lever worth 1 % shows on a busy machine. It defaults to
# PROBE_N=2000 calls per function and PROBE_KEYS=1000 keys (instruction
# counts see no cache misses, so a small key space measures the same code).
#
# Cases: one zone token bucket, one zone gcra, three zones (token bucket,
# token bucket, sliding window); on request (PROBE_CASES), one zone sliding
# window (sw1) or fixed window (fw1); one hot key (1e9 events a minute, never
# refusing) and PROBE_KEYS (100,000) random keys (1000 events a day, so a key's state
# outlives the time between its visits and is read and written each time;
# no key is visited 1000 times in a run), filled by the production function
# before the case is measured.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${PROBE_ROUNDS:-3}
CG=${PROBE_CALLGRIND:-0}
if [[ $CG == 1 ]]; then
	N=${PROBE_N:-2000} KEYS=${PROBE_KEYS:-1000} ROUNDS=${PROBE_ROUNDS:-1}
else
	N=${PROBE_N:-200000} KEYS=${PROBE_KEYS:-100000}
fi
FILL=$((KEYS * 3 > 300000 ? 300000 : (KEYS * 3 < 3000 ? 3000 : KEYS * 3)))
read -r -a FNS <<<"${PROBE_FNS:-p_empty p_time p_args p_floor p_decode p_codec p_step take}"
read -r -a CASES <<<"${PROBE_CASES:-tb1 gcra1 z3}"
tmp=$(mktemp -d)
go build -o "$tmp/benchtool" ./bench/benchtool
if [[ -z ${PROBE_LIBS:-} ]]; then
	"$tmp/benchtool" probelib >"$tmp/lib.lua"
	PROBE_LIBS="$tmp/lib.lua"
fi
read -r -a LIBS <<<"$PROBE_LIBS"
port=$("$tmp/benchtool" ports 1)
if [[ $CG == 1 ]]; then
	valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$tmp/cg.out" \
		redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --logfile "$tmp/redis.log" >"$tmp/valgrind.log" 2>&1 &
else
	redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --logfile "$tmp/redis.log" &
fi
rpid=$!
trap 'kill $rpid 2>/dev/null; wait $rpid; rm -rf "$tmp"' EXIT
cli() { redis-cli -p "$port" "$@"; }
for _ in $(seq 100); do cli ping >/dev/null 2>&1 && break; sleep 0.2; done

# A zone's argument (redisstore/script.go's layout): one, its spec
# "<algorithm>:<events>:<window>:<capacity>:<options>", cost, mode and
# instant joined by commas. A library of a layout before says in its code
# "local ARGS = 4" (those four fields as four arguments) or "local ARGS = 8"
# (algorithm, events, window, capacity, cost, mode, options, instant).
hot=(1000000000 60000 1000000000)
many=(1000 86400000 1000)
zone() { # layout algorithm keyspace
	local -n lim=$3
	case $1 in
	8) echo "$2 ${lim[0]} ${lim[1]} ${lim[2]} 1 0 0 0" ;;
	4) echo "$2:${lim[0]}:${lim[1]}:${lim[2]}:0 1 0 0" ;;
	*) echo "$2:${lim[0]}:${lim[1]}:${lim[2]}:0,1,0,0" ;;
	esac
}
args() { # layout case keyspace
	local k='{41-cb007107}'
	[[ $3 == many ]] && k='{__rand_int__}'
	case $2 in
	tb1) echo 1 "sluice:v1:a:$k" "$(zone "$1" 0 "$3")" ;;
	gcra1) echo 1 "sluice:v1:g:$k" "$(zone "$1" 1 "$3")" ;;
	sw1) echo 1 "sluice:v1:s:$k" "$(zone "$1" 2 "$3")" ;;
	fw1) echo 1 "sluice:v1:f:$k" "$(zone "$1" 3 "$3")" ;;
	z3) echo 3 "sluice:v1:a:$k" "sluice:v1:b:$k" "sluice:v1:c:$k" "$(zone "$1" 0 "$3")" "$(zone "$1" 0 "$3")" "$(zone "$1" 2 "$3")" ;;
	esac
}
cpu() { cli info cpu | awk -F: '/_main_thread:/ { s += $2 } END { printf "%.6f", s }'; }
stat() { cli info commandstats | awk -F'[:=,]' '/^cmdstat_fcall:/ { print $3, $7 }'; }
bench() { redis-benchmark -p "$port" -c 50 -P 16 -r "$KEYS" "$@" >/dev/null; }
# ir: callgrind's instruction count since it was last zeroed (a dump zeroes it).
ir() {
	callgrind_control -i off "$rpid" >/dev/null 2>&1
	rm -f "$tmp"/cg.out.*
	callgrind_control -d "$rpid" >/dev/null 2>&1
	cat "$tmp"/cg.out.* | awk '/^totals:/ { print $2; exit }'
}
# Every library is loaded at once, its probes renamed with its index (its
# decision function's name already differs), and the libraries take turns
# function by function, so a machine's drift hits them alike.
cli function flush >/dev/null
declare -a layouts takes
for li in "${!LIBS[@]}"; do
	sed "s/register_function('p_\([a-z]*\)'/register_function('p_\1_$li'/" "${LIBS[$li]}" | cli -x function load >/dev/null
	takes[li]=sluice_take_$(head -1 "${LIBS[$li]}" | sed 's/.*name=probe_sluice_//')
	layouts[li]=$(sed -n 's/^local ARGS = \([0-9]*\)$/\1/p' "${LIBS[$li]}" | head -1)
done
declare -A res wall
# p_floor writes a constant over the keys' states: with it, every case
# starts from no key and is filled again.
fill=1
for _ in $(seq "$ROUNDS"); do
	for c in "${CASES[@]}"; do
		for ks in hot many; do
			if [[ $fill == 1 || " ${FNS[*]} " == *" p_floor "* ]]; then
				cli flushall >/dev/null
				# shellcheck disable=SC2046
				bench -n "$FILL" FCALL "${takes[0]}" $(args "${layouts[0]}" "$c" "$ks")
			fi
			for f in "${FNS[@]}"; do
				for li in "${!LIBS[@]}"; do
					fn=${f}_$li
					[[ $f == take ]] && fn=${takes[li]}
					# shellcheck disable=SC2046
					bench -n $((N < 10000 ? N : 10000)) FCALL "$fn" $(args "${layouts[li]}" "$c" "$ks")
					cli config resetstat >/dev/null
					if [[ $CG == 1 ]]; then
						callgrind_control -z "$rpid" >/dev/null 2>&1
						callgrind_control -i on "$rpid" >/dev/null 2>&1
					fi
					c0=$(cpu)
					# shellcheck disable=SC2046
					bench -n "$N" FCALL "$fn" $(args "${layouts[li]}" "$c" "$ks")
					c1=$(cpu)
					[[ $CG == 1 ]] && c1=$(ir) c0=0
					read -r calls us < <(stat)
					if [[ $CG == 1 ]]; then
						res["$li $c $ks $f"]+="$(awk -v a="$c1" -v n="$calls" 'BEGIN { printf "%.0f", a / n }') "
					else
						res["$li $c $ks $f"]+="$(awk -v a="$c0" -v b="$c1" -v n="$calls" 'BEGIN { printf "%.3f", (b - a) * 1e6 / n }') "
					fi
					wall["$li $c $ks $f"]+="$us "
				done
			done
		done
	done
	fill=0
done
med() { tr ' ' '\n' | grep . | sort -g | awk -v f="$([[ $CG == 1 ]] && echo %.0f || echo %.2f)" '{ v[NR] = $1 } END { printf f, v[int((NR + 1) / 2)] }'; }
hdr="| function |"
sep="|---|"
for c in "${CASES[@]}"; do for ks in hot many; do for li in "${!LIBS[@]}"; do
	hdr+=" $c $ks${LIBS[1]:+ L$li} |"; sep+="--:|"
done; done; done
table() {
	local -n t=$1
	echo "$hdr"; echo "$sep"
	for f in "${FNS[@]}"; do
		line="| $f |"
		for c in "${CASES[@]}"; do for ks in hot many; do for li in "${!LIBS[@]}"; do
			line+=" $(med <<<"${t["$li $c $ks $f"]}") |"
		done; done; done
		echo "$line"
	done
}
if [[ $CG == 1 ]]; then
	echo "Instructions per call inside redis-server (callgrind), $N calls, $KEYS keys, median of $ROUNDS rounds:"; echo
	table res
	exit 0
fi
echo "Redis main thread CPU per call (µs), median of $ROUNDS rounds:"; echo
table res
echo; echo "usec_per_call of FCALL (INFO commandstats), median of $ROUNDS rounds:"; echo
table wall
