#!/usr/bin/env bash
# bench/run.sh — the benchmark harness behind `make bench` (see bench/README.md).
#
# In one run on this machine it compares bare Caddy `respond` with Sluice in
# front of the same `respond` (memory store and Redis, allowing and refusing,
# and a rate zone with a concurrency zone beside it: memconc, redisconc)
# and with the Redis ceiling for the production decision script, all with
# public tools (wrk, redis-benchmark, go test -bench), and prints ratios to
# bare Caddy, and Redis's time per decision beside its floor (target
# decide). Targets are interleaved over several rounds so that drift in the
# machine's load hits all of them alike; the table shows medians.
#
#   1. installs wrk (apt) and Redis (scripts/ensure-redis.sh) when missing
#      and root; builds bench/bin/caddy (./cmd/caddy) and bench/bin/benchtool
#   2. starts its own redis-server and one Caddy (one site per target, on
#      free loopback ports, generated Caddyfile) — loopback only
#   3. warm-up, then BENCH_ROUNDS rounds of every target for
#      BENCH_DURATION seconds each (wrk -t2 -c50; redis-benchmark -c50 and
#      -c50 -P16 running FCALL of redisstore.LuaLibrary's function), Redis's
#      INFO commandstats reset before each (CONFIG RESETSTAT) and read after
#      it: its time per decision script; and per round the target decide:
#      redis-benchmark -P16 of the decision and of its floor (benchtool
#      floorlib), BENCH_DECIDE_N calls each, one zone (token bucket, GCRA)
#      and three zones, a hot key and 100,000 keys
#   4. optional CPU profiles of Caddy under load (BENCH_PROFILE="mem1 redis1")
#   5. stops its servers, then runs the Go benchmarks (-benchmem) and the
#      memory-per-key tests once
#   6. writes bench/results/<UTC timestamp>.md (raw data in the folder of the
#      same name) and copies it to bench/RESULTS.md, keeping that file's
#      "## History" section
#
# Knobs (environment): BENCH_ROUNDS (5), BENCH_DURATION (5, seconds),
# BENCH_WARMUP (2), BENCH_CONNECTIONS (50), BENCH_THREADS (2),
# BENCH_PIPELINE (16), BENCH_TARGETS (all, space-separated names: bare barek mem1
# mem3 memconc memdeny redis1 redis3 redisconc redis1k redis3k redis1ka
# redis3ka redislocal redisdeny rb_plain rb_pipe decide), BENCH_PROFILE
# (targets to CPU-profile, none by default), BENCH_PROFILE_SECONDS (10),
# BENCH_GO (1; 0 skips the Go benchmarks and memory tests), BENCH_MAX_OTHER
# (0.3) and BENCH_RETRIES (1): a run during which other processes of the
# machine used more than BENCH_MAX_OTHER cores is run again, up to
# BENCH_RETRIES times, and the quietest run is kept. BENCH_REDIS_OPTS: one
# more line inside every `store redis { }` block, to try a setting (for
# example "pool_size 64"); none by default.
# BENCH_KEYS (100000): clients of the many-key targets (wrk-keys.lua).
# BENCH_DECIDE_N (40000): calls per run of the target decide.
# BENCH_CADDY: a Caddy binary with Sluice to measure instead of building
# ./cmd/caddy (another commit's build, for a before/after comparison: only
# the sites of BENCH_TARGETS are configured, so an older build needs to
# know only their settings).
# Default total: about 9 minutes on 2 idle cores (build cached; 10–11 with
# BENCH_PROFILE), of which the target decide takes about 1; runs repeated
# for other processes' load add to it (14 minutes on a busy machine).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

ROUNDS=${BENCH_ROUNDS:-5}
DURATION=${BENCH_DURATION:-5}
WARMUP=${BENCH_WARMUP:-2}
CONNS=${BENCH_CONNECTIONS:-50}
THREADS=${BENCH_THREADS:-2}
PIPELINE=${BENCH_PIPELINE:-16}
PROFILE=${BENCH_PROFILE:-}
PROFILE_SECONDS=${BENCH_PROFILE_SECONDS:-10}
GOBENCH=${BENCH_GO:-1}
MAX_OTHER=${BENCH_MAX_OTHER:-0.3}
RETRIES=${BENCH_RETRIES:-1}
REDIS_OPTS=${BENCH_REDIS_OPTS:-}
read -r -a TARGETS <<<"${BENCH_TARGETS:-bare barek mem1 mem3 memconc memdeny redis1 redis3 redisconc redis1k redis3k redis1ka redis3ka redislocal redisdeny rb_plain rb_pipe decide}"
KEYS=${BENCH_KEYS:-100000}
export BENCH_KEYS=$KEYS # wrk-keys.lua reads it
DECIDE_N=${BENCH_DECIDE_N:-40000}
GO=${GO:-go}

log() { printf 'bench: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# ---- 1. tools ----------------------------------------------------------------

command -v "$GO" >/dev/null 2>&1 || die "go is not on PATH (Go $(sed -n 's/^go //p' go.mod) or newer is needed)"

apt_install() {
	if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
		die "$1 is missing; install it (Debian/Ubuntu: sudo apt-get install $*) and run again"
	fi
	log "installing $* with apt-get"
	export DEBIAN_FRONTEND=noninteractive
	local aptlog
	aptlog=$(mktemp -t bench-apt.XXXXXX)
	if ! apt-get install -y -q --no-install-recommends "$@" >"$aptlog" 2>&1; then
		apt-get update -q >"$aptlog" 2>&1 || {
			cat "$aptlog" >&2
			rm -f "$aptlog"
			die "apt-get update failed"
		}
		apt-get install -y -q --no-install-recommends "$@" >"$aptlog" 2>&1 || {
			tail -n 30 "$aptlog" >&2
			rm -f "$aptlog"
			die "apt-get install $* failed"
		}
	fi
	rm -f "$aptlog"
}

command -v wrk >/dev/null 2>&1 || apt_install wrk
bash scripts/ensure-redis.sh >/dev/null || die "Redis is needed (scripts/ensure-redis.sh)"
command -v redis-benchmark >/dev/null 2>&1 || apt_install redis-tools

log "building bench/bin/caddy and bench/bin/benchtool"
mkdir -p bench/bin
CADDY=$ROOT/bench/bin/caddy
if [[ -n "${BENCH_CADDY:-}" ]]; then
	CADDY=$(realpath "$BENCH_CADDY")
	log "measuring $CADDY (BENCH_CADDY)"
else
	"$GO" build -o bench/bin/caddy ./cmd/caddy
fi
"$GO" build -o bench/bin/benchtool ./bench/benchtool
BT=$ROOT/bench/bin/benchtool

# ---- 2. servers --------------------------------------------------------------

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=$ROOT/bench/results/$STAMP
REPORT=$ROOT/bench/results/$STAMP.md
mkdir -p "$OUT"
TMP=$(mktemp -d -t sluice-bench.XXXXXX)
PIDS=()

cleanup() {
	local pid
	for pid in "${PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${PIDS[@]}"; do
		for _ in $(seq 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
		wait "$pid" 2>/dev/null || true
	done
	PIDS=()
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

read -r P_REDIS P_ADMIN P_BARE P_MEM1 P_MEM3 P_MEMDENY P_REDIS1 P_REDIS3 P_REDISDENY P_MEMCONC P_REDISCONC P_REDIS1K P_REDIS3K P_REDISLOCAL P_REDIS1KA P_REDIS3KA <<<"$("$BT" ports 16)"
declare -A PORT=([bare]=$P_BARE [barek]=$P_BARE [mem1]=$P_MEM1 [mem3]=$P_MEM3 [memdeny]=$P_MEMDENY
	[redis1]=$P_REDIS1 [redis3]=$P_REDIS3 [redisdeny]=$P_REDISDENY
	[memconc]=$P_MEMCONC [redisconc]=$P_REDISCONC
	[redis1k]=$P_REDIS1K [redis3k]=$P_REDIS3K [redislocal]=$P_REDISLOCAL
	[redis1ka]=$P_REDIS1KA [redis3ka]=$P_REDIS3KA)
# Targets whose load carries a key per client (wrk-keys.lua).
# barek is bare Caddy under that load: the many-key targets' baseline (the
# script costs wrk more CPU per request, which it takes from Caddy).
declare -A KEYED=([barek]=1 [redis1k]=1 [redis3k]=1 [redis1ka]=1 [redis3ka]=1)
ADMIN=http://127.0.0.1:$P_ADMIN

redis-server --bind 127.0.0.1 --port "$P_REDIS" --save '' --appendonly no --dir "$TMP" \
	--daemonize no --loglevel warning --logfile "$OUT/redis.log" &
PIDS+=($!)
REDIS_PID=$!
for _ in $(seq 100); do
	redis-cli -h 127.0.0.1 -p "$P_REDIS" ping >/dev/null 2>&1 && break
	sleep 0.1
done
redis-cli -h 127.0.0.1 -p "$P_REDIS" ping >/dev/null || die "redis-server did not start (see $OUT/redis.log)"

# The production decision, loaded as Sluice loads it (a Redis Function
# library); its ARGV per redisstore's script arguments (lua/take.lua): one
# per zone, its spec "<algorithm>:<events>:<window ms>:<capacity>:<options>"
# (token bucket, no options), cost 1, mode 0 (take) and instant 0 (a
# take's), joined by commas. One KEYS entry, a production-shaped key. A
# one-zone admission with no wait replies one packed integer; any other
# reply is an array of integers, allowed first.
LIB=$("$BT" lualib | redis-cli -h 127.0.0.1 -p "$P_REDIS" -x FUNCTION LOAD REPLACE)
FN=$("$BT" luafn)
[[ "$LIB" == sluice_* ]] || die "FUNCTION LOAD failed: $LIB"
RB_KEY='sluice:v1:rb:{127.0.0.1}'
RB_ARGS=(FCALL "$FN" 1 "$RB_KEY" 0:1000000000:60000:1000000000:0,1,0,0)
probe=$(redis-cli -h 127.0.0.1 -p "$P_REDIS" "${RB_ARGS[@]}" 2>&1 | tr '\n' ' ')
[[ "$probe" =~ ^[0-9]+\ $ || "$probe" == "1 "* ]] || die "FCALL of the production decision did not allow: $probe"
# The floor beside it (target decide): TIME, and per zone GET and SET PX.
FLOOR_FN=sluice_floor
lib=$("$BT" floorlib | redis-cli -h 127.0.0.1 -p "$P_REDIS" -x FUNCTION LOAD REPLACE)
[[ "$lib" == sluice_bench_floor ]] || die "FUNCTION LOAD of the floor failed: $lib"

# One Caddy, one site per target. Never-refusing zones allow 1e9 events per
# minute; refusing zones allow 1 per hour (the first request of the run
# passes, every later one is refused). Most zones key on {client_ip}, so
# all load hits one key per zone (a hot key) and the three zones of a
# request share one identity (one Redis script call per request); the
# many-key targets (redis1k, redis3k) key on X-Api-Key, which wrk-keys.lua
# sets to one of BENCH_KEYS clients per request, and allow 1000 events a
# day per key (never refusing: a run visits a key a few times), so a
# key's state outlives the time between its visits and each decision reads
# and writes a live state; redislocal is redis1 with a local allowance;
# redis1ka and redis3ka are redis1k and redis3k in the asynchronous mode
# (sliding_window, sync 50ms: no Redis call per request).
# The concurrency zone beside a rate zone (memconc, redisconc) never
# refuses either (wrk keeps at most BENCH_CONNECTIONS requests in flight):
# what it adds is taking a slot in the same call, and giving it back after
# the response (with Redis, a pipelined ZREM per request).
never='events 1000000000
			window 1m'
daily='events 1000
			window 1d'
dailyasync='events 1000
			window 1d
			algorithm sliding_window'
deny='events 1
			window 1h'
slots='concurrent 100000'
zone() { # name limit [key] [extra line]
	printf '\t\tzone %s {\n\t\t\tkey %s\n\t\t\t%s\n' "$1" "${3:-{client_ip\}}" "$2"
	[[ -z "${4:-}" ]] || printf '\t\t\t%s\n' "$4"
	printf '\t\t}\n'
}
apikey='{http.request.header.X-Api-Key}'
site() { # port zones... (as text)
	printf ':%s {\n' "$1"
	if [[ -n "$2" ]]; then
		printf '\trate_limit {\n%s' "$2"
		[[ -n "${3:-}" ]] && printf '%s' "$3"
		printf '\t}\n'
	fi
	printf '\trespond "ok" 200\n}\n\n'
}
redis_store=$(
	printf '\t\tstore redis {\n\t\t\turl redis://127.0.0.1:%s\n' "$P_REDIS"
	[[ -z "$REDIS_OPTS" ]] || printf '\t\t\t%s\n' "$REDIS_OPTS"
	printf '\t\t}\n'
)$'\n'
# want: the target is measured (its site is configured); bare always is.
want() { [[ " ${TARGETS[*]} " == *" $1 "* ]]; }
{
	printf '{\n\tadmin 127.0.0.1:%s\n\tauto_https off\n\tdefault_bind 127.0.0.1\n\tpersist_config off\n\tgrace_period 2s\n}\n\n' "$P_ADMIN"
	site "$P_BARE" ""
	want mem1 && site "$P_MEM1" "$(zone mem1 "$never")"$'\n'
	want mem3 && site "$P_MEM3" "$(zone mem3a "$never")"$'\n'"$(zone mem3b "$never")"$'\n'"$(zone mem3c "$never")"$'\n'
	want memdeny && site "$P_MEMDENY" "$(zone memdeny "$deny")"$'\n'
	want memconc && site "$P_MEMCONC" "$(zone memconc "$never")"$'\n'"$(zone memconcslots "$slots")"$'\n'
	want redis1 && site "$P_REDIS1" "$(zone redis1 "$never")"$'\n' "$redis_store"
	want redis3 && site "$P_REDIS3" "$(zone redis3a "$never")"$'\n'"$(zone redis3b "$never")"$'\n'"$(zone redis3c "$never")"$'\n' "$redis_store"
	want redisdeny && site "$P_REDISDENY" "$(zone redisdeny "$deny")"$'\n' "$redis_store"
	want redisconc && site "$P_REDISCONC" "$(zone redisconc "$never")"$'\n'"$(zone redisconcslots "$slots")"$'\n' "$redis_store"
	want redis1k && site "$P_REDIS1K" "$(zone redis1k "$daily" "$apikey")"$'\n' "$redis_store"
	want redis3k && site "$P_REDIS3K" "$(zone redis3ka "$daily" "$apikey")"$'\n'"$(zone redis3kb "$daily" "$apikey")"$'\n'"$(zone redis3kc "$daily" "$apikey")"$'\n' "$redis_store"
	want redis1ka && site "$P_REDIS1KA" "$(zone redis1ka "$dailyasync" "$apikey" "sync 50ms")"$'\n' "$redis_store"
	want redis3ka && site "$P_REDIS3KA" "$(zone redis3kaa "$dailyasync" "$apikey" "sync 50ms")"$'\n'"$(zone redis3kab "$dailyasync" "$apikey" "sync 50ms")"$'\n'"$(zone redis3kac "$dailyasync" "$apikey" "sync 50ms")"$'\n' "$redis_store"
	want redislocal && site "$P_REDISLOCAL" "$(zone redislocal "$never" "" local_allowance)"$'\n' "$redis_store"
	: # (a last target not wanted is not a failure)
} >"$OUT/Caddyfile"

XDG_CONFIG_HOME=$TMP/config XDG_DATA_HOME=$TMP/data \
	"$CADDY" run --config "$OUT/Caddyfile" --adapter caddyfile >"$OUT/caddy.log" 2>&1 &
PIDS+=($!)
CADDY_PID=$!
SERVER_PIDS="$CADDY_PID $REDIS_PID" # this order: measure() reads them so
"$BT" wait "$ADMIN/config/" 30 || die "Caddy did not start (see $OUT/caddy.log)"
for t in "${!PORT[@]}"; do
	[[ $t == bare ]] || want "$t" || continue
	"$BT" wait "http://127.0.0.1:${PORT[$t]}/" 10 || die "Caddy site $t did not answer (see $OUT/caddy.log)"
done
log "redis on :$P_REDIS, caddy admin on :$P_ADMIN (pid $CADDY_PID), sites: $(for t in bare mem1 mem3 memconc memdeny redis1 redis3 redisconc redis1k redis3k redis1ka redis3ka redislocal redisdeny; do printf '%s :%s  ' "$t" "${PORT[$t]}"; done)"

{
	echo "date         $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "commit       $(git rev-parse --short HEAD 2>/dev/null || echo '?')$( [[ -n "$(git status --porcelain 2>/dev/null)" ]] && echo ' + uncommitted changes')"
	echo "go           $("$GO" version | cut -d' ' -f3-)"
	echo "caddy        $("$CADDY" version | cut -d' ' -f1)$([[ -z "${BENCH_CADDY:-}" ]] || echo " ($BENCH_CADDY)")"
	echo "wrk          $(wrk -v 2>&1 | head -n1 | cut -d' ' -f1-2)"
	echo "redis        $(redis-server --version | grep -o 'v=[0-9.]*')"
	echo "cpu          $(nproc) x $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
	echo "load before  $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "settings     $ROUNDS rounds x ${DURATION}s per target (after a ${WARMUP}s warm-up); wrk -t$THREADS -c$CONNS; redis-benchmark -c$CONNS, -P $PIPELINE"
	echo "             load generator, Caddy and Redis share the same cores; one key per zone ({client_ip}), $KEYS for redis1k, redis3k, redis1ka and redis3ka (X-Api-Key)"
	echo "decide       redis-benchmark -c$CONNS -P $PIPELINE, $DECIDE_N calls per run, the decision and its floor taking turns"
	echo "quiet        a run counts as quiet when other processes used at most $MAX_OTHER cores meanwhile (retries: $RETRIES)"
} >"$OUT/meta.txt"

# ---- 3. measurements ---------------------------------------------------------

# snapvals prints Caddy's counters as numbers: mallocs bytes allowed refused failed store_errors.
snapvals() {
	"$BT" snap "$ADMIN" | tr ' ' '\n' | cut -d= -f2 | tr '\n' ' '
}

rcli() { redis-cli -h 127.0.0.1 -p "$P_REDIS" "$@"; }
# rstat: the decision scripts Redis has run since its statistics were reset
# (CONFIG RESETSTAT) and the time it spent in them, µs (INFO commandstats:
# FCALL, FCALL_RO, EVALSHA, EVAL).
rstat() {
	rcli INFO commandstats 2>/dev/null |
		awk -F'[:=,]' '/^cmdstat_(fcall|fcall_ro|evalsha|eval):/ { n += $3; u += $5 } END { printf "%d %d\n", n, u }'
}
# rcpu: the CPU seconds Redis's main thread has used (INFO cpu).
rcpu() { rcli INFO cpu | awk -F: '/_main_thread:/ { s += $2 } END { printf "%.6f", s }'; }

# loadgen CMD...: runs a load generator (output in $TMP/gen.out) and prints
# the CPU seconds it used (user+system), so that what the rest of the
# machine did meanwhile can be told apart from our own load.
loadgen() {
	local TIMEFORMAT='%U %S'
	{ time "$@" >"$TMP/gen.out" 2>&1; } 2>"$TMP/gen.time" || true
	awk '{ print $1 + $2 }' "$TMP/gen.time"
}
now_ns() { date +%s%N; }

# measure ROUND TARGET SECONDS: one run; prints one raw.tsv line:
# round target rps p50_us p99_us requests status>=400 socket_errors
# mallocs alloc_bytes allowed refused failed store_errors other_cpu steal
# caddy_cpu redis_cpu gen_cpu (cores, averaged over the run; other_cpu:
# processes other than this run's Caddy, Redis and load generator; steal:
# the hypervisor's) redis_calls (decision scripts Redis ran) redis_usec
# (Redis's time inside them, µs: INFO commandstats, reset before the run).
TICK=$(getconf CLK_TCK 2>/dev/null || echo 100)
RB_RPS_PLAIN=30000
RB_RPS_PIPE=60000
measure() {
	local round=$1 t=$2 secs=$3 before="" after="" c0 c1 t0 t1 gen res calls usec
	case $t in
	rb_plain | rb_pipe)
		local p=1 est=$RB_RPS_PLAIN n
		if [[ $t == rb_pipe ]]; then p=$PIPELINE est=$RB_RPS_PIPE; fi
		n=$(awk -v r="$est" -v s="$secs" 'BEGIN { printf "%d", r * s }')
		rcli CONFIG RESETSTAT >/dev/null
		c0=$("$BT" cpu $SERVER_PIDS) t0=$(now_ns)
		gen=$(loadgen timeout $((secs * 5 + 30)) redis-benchmark -h 127.0.0.1 -p "$P_REDIS" \
			-c "$CONNS" -n "$n" -P "$p" --csv "${RB_ARGS[@]}")
		t1=$(now_ns) c1=$("$BT" cpu $SERVER_PIDS)
		read -r calls usec < <(rstat)
		# "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms";
		# read from the end: the test's name holds the zone's argument, whose commas split it.
		res=$(tail -n1 "$TMP/gen.out" | tr -d '"' | awk -F, -v n="$n" '$(NF-6) > 0 { printf "%s %.0f %.0f %d 0 0 - - - - - -", $(NF-6), $(NF-3) * 1000, $(NF-1) * 1000, n }')
		[[ -n "$res" ]] || die "redis-benchmark gave no result for $t: $(tail -n3 "$TMP/gen.out")"
		;;
	*)
		local port=${PORT[$t]} line script=$ROOT/bench/wrk-report.lua
		[[ -z "${KEYED[$t]:-}" ]] || script=$ROOT/bench/wrk-keys.lua
		before=$(snapvals)
		rcli CONFIG RESETSTAT >/dev/null
		c0=$("$BT" cpu $SERVER_PIDS) t0=$(now_ns)
		gen=$(loadgen timeout $((secs + 30)) wrk -t"$THREADS" -c"$CONNS" -d"${secs}s" --timeout 5s \
			-s "$script" "http://127.0.0.1:$port/")
		t1=$(now_ns) c1=$("$BT" cpu $SERVER_PIDS)
		after=$(snapvals)
		read -r calls usec < <(rstat)
		line=$(grep '^SLUICE_BENCH' "$TMP/gen.out" || true)
		[[ -n "$line" ]] || die "wrk gave no result for $t: $(tail -n3 "$TMP/gen.out")"
		res=$(awk -v line="$line" -v b="$before" -v a="$after" 'BEGIN {
			split(line, w, " "); split(b, x, " "); split(a, y, " ")
			printf "%.1f %d %d %d %d %d", w[2] * 1e6 / w[3], w[4], w[5], w[2], w[6], w[7]
			for (i = 1; i <= 6; i++) printf " %d", y[i] - x[i]
		}')
		;;
	esac
	awk -v round="$round" -v t="$t" -v res="$res" -v c0="$c0" -v c1="$c1" -v gen="$gen" -v calls="$calls" -v usec="$usec" \
		-v wall="$(((t1 - t0) / 1000000))" -v tick="$TICK" 'BEGIN {
		split(c0, a, " "); split(c1, b, " ")
		s = wall / 1000 * tick
		caddy = b[3] - a[3]; redis = b[4] - a[4]
		other = ((b[1] - a[1]) - caddy - redis - gen * tick) / s
		if (other < 0) other = 0
		n = split(res, r, " ")
		printf "%s\t%s", round, t
		for (i = 1; i <= n; i++) printf "\t%s", r[i]
		printf "\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t%s\n", other, (b[2] - a[2]) / s, caddy / s, redis / s, gen * tick / s, calls, usec
	}'
}

show() { # a raw.tsv line, for the progress log
	awk -F'\t' '{ printf "round %s %-9s %9.0f req/s  p50 %6.2f ms  p99 %6.2f ms  other load %.2f cores\n", $1, $2, $3, $4 / 1000, $5 / 1000, $15 }' <<<"$1" >&2
}

RAW=$OUT/raw.tsv
printf 'round\ttarget\trps\tp50_us\tp99_us\trequests\tstatus_ge_400\tsocket_errors\tmallocs\talloc_bytes\tallowed\trefused\tfailed\tstore_errors\tother_cpu\tsteal\tcaddy_cpu\tredis_cpu\tgen_cpu\tredis_calls\tredis_usec\n' >"$RAW"

# The decision against its floor inside Redis (target decide): per case
# (tb1, gcra1: one zone, token bucket or GCRA; z3: three zones, token
# bucket, token bucket, sliding window) and key space (one hot key, 1e9
# events a minute; or 100,000 keys, 1000 events a day, so every visit reads
# and writes a live state), the production function and the floor (benchtool
# floorlib: TIME, and per zone GET and SET PX of a constant, on keys of its
# own) with the same arguments, one after the other. One line of
# decide.tsv per run: round case keys fn calls usec (INFO commandstats)
# cpu_us (Redis's main thread, INFO cpu) other_cpu (cores other processes
# used meanwhile).
DECIDE=$OUT/decide.tsv
printf 'round\tcase\tkeys\tfn\tcalls\tusec\tcpu_us\tother_cpu\n' >"$DECIDE"
decide_args() { # case keys floor|take: FCALL's key count, keys and arguments
	local k='{41-cb007107}' lim=1000000000:60000:1000000000 p=sluice:v1:d
	if [[ $2 == many ]]; then k='{__rand_int__}' lim=1000:86400000:1000; fi
	[[ $3 == floor ]] && p=sluice:v1:f
	case $1 in
	tb1) echo 1 "${p}tb:$k" "0:$lim:0,1,0,0" ;;
	gcra1) echo 1 "${p}g:$k" "1:$lim:0,1,0,0" ;;
	z3) echo 3 "${p}a:$k" "${p}b:$k" "${p}c:$k" "0:$lim:0,1,0,0" "0:$lim:0,1,0,0" "2:$lim:0,1,0,0" ;;
	esac
}
decide_run() { # round case keys fn calls: one run; appends a line to decide.tsv (round > 0)
	local fn=$FN r=() c0 c1 p0 p1 t0 t1 gen calls usec
	[[ $4 == floor ]] && fn=$FLOOR_FN
	[[ $3 == many ]] && r=(-r 100000)
	rcli CONFIG RESETSTAT >/dev/null
	c0=$(rcpu) p0=$("$BT" cpu $SERVER_PIDS) t0=$(now_ns)
	# shellcheck disable=SC2046
	gen=$(loadgen timeout 120 redis-benchmark -h 127.0.0.1 -p "$P_REDIS" -c "$CONNS" -P "$PIPELINE" \
		-n "$5" "${r[@]}" FCALL "$fn" $(decide_args "$2" "$3" "$4"))
	t1=$(now_ns) p1=$("$BT" cpu $SERVER_PIDS) c1=$(rcpu)
	read -r calls usec < <(rstat)
	((calls > 0)) || die "decide: $4 $2 $3 ran no call: $(tail -n3 "$TMP/gen.out")"
	((${1} > 0)) || return 0
	awk -v round="$1" -v c="$2" -v k="$3" -v fn="$4" -v calls="$calls" -v usec="$usec" -v c0="$c0" -v c1="$c1" \
		-v p0="$p0" -v p1="$p1" -v gen="$gen" -v wall="$(((t1 - t0) / 1000000))" -v tick="$TICK" 'BEGIN {
		split(p0, a, " "); split(p1, b, " ")
		other = ((b[1] - a[1]) - (b[3] - a[3]) - (b[4] - a[4]) - gen * tick) / (wall / 1000 * tick)
		if (other < 0) other = 0
		printf "%s\t%s\t%s\t%s\t%d\t%d\t%.0f\t%.2f\n", round, c, k, fn, calls, usec, (c1 - c0) * 1e6, other
	}' >>"$DECIDE"
}
decide_round() { # round [calls]
	local c k f
	for k in hot many; do
		for c in tb1 gcra1 z3; do
			for f in take floor; do
				# one zone's floor is the same for tb1 and gcra1
				[[ $c == gcra1 && $f == floor ]] && continue
				decide_run "$1" "$c" "$k" "$f" "${2:-$DECIDE_N}"
			done
		done
	done
	log "round $1 decide: $(awk -F'\t' -v r="$1" '$1 == r { printf "%s %s %s %.2f µs  ", $2, $3, $4, $6 / $5 }' "$DECIDE")"
}

log "warm-up (${WARMUP}s per target)"
for t in "${TARGETS[@]}"; do
	if [[ $t == decide ]]; then
		# fills the 100,000-key spaces (about 86 % of their keys)
		log "filling the decide target's keys"
		decide_round 0 200000
		continue
	fi
	line=$(measure 0 "$t" "$WARMUP")
	show "$line"
	# Size redis-benchmark's request count from the warm-up rate, so each of
	# its runs lasts about BENCH_DURATION seconds.
	rps=$(cut -f3 <<<"$line" | cut -d. -f1)
	if [[ $t == rb_plain && ${rps:-0} -gt 0 ]]; then RB_RPS_PLAIN=$rps; fi
	if [[ $t == rb_pipe && ${rps:-0} -gt 0 ]]; then RB_RPS_PIPE=$rps; fi
done

# quiet LINE: whether the rest of the machine stayed under MAX_OTHER cores.
quiet() { awk -F'\t' -v max="$MAX_OTHER" '{ exit !($15 <= max) }' <<<"$1"; }

n=${#TARGETS[@]}
for ((r = 1; r <= ROUNDS; r++)); do
	log "round $r/$ROUNDS (${DURATION}s per target)"
	for ((i = 0; i < n; i++)); do
		t=${TARGETS[(i + r - 1) % n]} # each round starts one target later
		if [[ $t == decide ]]; then
			decide_round "$r"
			continue
		fi
		line=$(measure "$r" "$t" "$DURATION")
		show "$line"
		# A shared machine: when other processes took more than MAX_OTHER
		# cores during the run, run it again (RETRIES times at most) and keep
		# the quietest run.
		for ((k = 0; k < RETRIES; k++)); do
			quiet "$line" && break
			log "other processes used $(cut -f15 <<<"$line") cores meanwhile; again"
			again=$(measure "$r" "$t" "$DURATION")
			show "$again"
			if awk -F'\t' -v a="$(cut -f15 <<<"$again")" '{ exit !(a < $15) }' <<<"$line"; then line=$again; fi
		done
		echo "$line" >>"$RAW"
	done
done

# Redis's own view (every command's time per call, since the last run's
# CONFIG RESETSTAT) and Sluice's store latency histogram.
redis-cli -h 127.0.0.1 -p "$P_REDIS" INFO commandstats >"$OUT/redis-commandstats.txt" 2>&1 || true
"$BT" fetch "$ADMIN/metrics" "$OUT/caddy-metrics.txt" || true

# ---- 4. profiles ---------------------------------------------------------------

: >"$OUT/profiles.txt"
for t in $PROFILE; do
	[[ -n "${PORT[$t]:-}" ]] || {
		log "BENCH_PROFILE: $t is not an HTTP target; skipped"
		continue
	}
	log "CPU profile of Caddy under load: $t (${PROFILE_SECONDS}s)"
	script=$ROOT/bench/wrk-report.lua
	[[ -z "${KEYED[$t]:-}" ]] || script=$ROOT/bench/wrk-keys.lua
	wrk -t"$THREADS" -c"$CONNS" -d"$((PROFILE_SECONDS + 2))s" -s "$script" \
		"http://127.0.0.1:${PORT[$t]}/" >"$TMP/prof-wrk.out" 2>&1 &
	wrk_pid=$!
	PIDS+=("$wrk_pid")
	sleep 1
	"$BT" fetch "$ADMIN/debug/pprof/profile?seconds=$PROFILE_SECONDS" "$OUT/cpu-$t.pprof" || log "profile of $t failed"
	wait "$wrk_pid" 2>/dev/null || true
	unset 'PIDS[-1]'
	if [[ -s "$OUT/cpu-$t.pprof" ]]; then
		top=$("$GO" tool pprof -top -cum -nodecount=45 "$CADDY" "$OUT/cpu-$t.pprof" 2>/dev/null || true)
		{
			echo "== $t: go tool pprof -top -cum bench/bin/caddy $(basename "$OUT")/cpu-$t.pprof"
			# Caddy's CPU per request: profile samples over the requests
			# wrk counted (its run is 2 s longer than the profile).
			awk -v top="$top" '/^SLUICE_BENCH/ {
				rps = $2 * 1e6 / $3
				if (match(top, /Total samples = [0-9.]+m?s/)) {
					v = substr(top, RSTART + 16, RLENGTH - 16)
					ms = (v ~ /ms$/) ? v + 0 : v * 1000
				}
				printf "wrk: %.0f req/s; Caddy CPU %.0f ms/s = %.1f µs per request\n", rps, ms / '"$PROFILE_SECONDS"', ms * 1000 / '"$PROFILE_SECONDS"' / rps
			}' "$TMP/prof-wrk.out"
			sed -n '1,55p' <<<"$top"
			echo
		} >>"$OUT/profiles.txt"
	fi
done

log "stopping servers"
cleanup
trap - EXIT

# ---- 5. Go benchmarks and memory per key --------------------------------------

if [[ "$GOBENCH" != 0 ]]; then
	log "Go benchmarks (go test -bench -benchmem)"
	{
		"$GO" test -count=1 -timeout 10m -run XXX -bench . -benchmem ./memstore/ ./identity/ ./algorithms/ . 2>&1 || echo "FAILED: go test -bench ./memstore/ ./identity/ ./algorithms/ ."
		"$GO" test -count=1 -timeout 10m -run XXX -bench Take -benchmem ./redisstore/ 2>&1 || echo "FAILED: go test -bench Take ./redisstore/"
	} >"$OUT/gobench.txt"
	grep -E '^(FAILED|ok|---)' "$OUT/gobench.txt" >&2 || true
	log "memory per key (TestMemoryPerKey, TestRedisMemoryPerKey)"
	{
		"$GO" test -count=1 -timeout 10m -run '^TestMemoryPerKey$' -v ./memstore/ 2>&1 || echo "FAILED: TestMemoryPerKey"
		"$GO" test -count=1 -timeout 10m -run '^TestRedisMemoryPerKey$' -v ./redisstore/ 2>&1 || echo "FAILED: TestRedisMemoryPerKey"
	} >"$OUT/memkey.txt"
	grep -E '^(FAILED|ok|---)' "$OUT/memkey.txt" >&2 || true
fi

# ---- 6. report -----------------------------------------------------------------

echo "load after   $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/meta.txt"
"$BT" report "$OUT" >"$REPORT"
# RESULTS.md is the new report followed by the previous RESULTS.md's
# "## History" section (the earlier runs, kept by hand).
history="$(sed -n '/^## History$/,$p' "$ROOT/bench/RESULTS.md" 2>/dev/null || true)"
cp "$REPORT" "$ROOT/bench/RESULTS.md"
if [ -n "$history" ]; then
	printf '\n%s\n' "$history" >>"$ROOT/bench/RESULTS.md"
fi
echo
cat "$REPORT"
echo
log "report: bench/results/$STAMP.md (raw data in bench/results/$STAMP/), copied to bench/RESULTS.md"
