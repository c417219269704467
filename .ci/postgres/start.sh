#!/usr/bin/env bash
# start.sh starts a throwaway PostgreSQL (the installed binaries, found with
# pg_config --bindir) on a free 127.0.0.1 port and prints exactly one line on
# stdout:
#
#   export SINKBATCH_POSTGRES_DSN=postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable
#
# so that `eval "$(bash .ci/postgres/start.sh)"` points outbox's tests at it.
# The data directory, socket and log live in $SINKBATCH_POSTGRES_DIR (a fresh
# temporary directory unless set). PostgreSQL refuses to run as root: as
# root, the server runs as the postgres user. fsync is off: the tests kill
# relays, never the server. The server stops, and its directory is removed,
# when the process that ran this script exits (or SINKBATCH_POSTGRES_PARENT,
# a pid, if set).
set -euo pipefail

bin="$(pg_config --bindir 2>/dev/null || true)"
if [[ -z "$bin" || ! -x "$bin/initdb" ]]; then
	bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
fi
if [[ -z "$bin" || ! -x "$bin/initdb" ]]; then
	echo "postgres: no PostgreSQL binaries (pg_config --bindir)" >&2
	exit 1
fi

dir="${SINKBATCH_POSTGRES_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/sinkbatch-postgres.XXXXXX")}"
mkdir -p "$dir"
as=()
if [[ "$(id -u)" == 0 ]]; then
	chown postgres: "$dir"
	as=(runuser -u postgres --)
fi
parent="${SINKBATCH_POSTGRES_PARENT:-$PPID}"

"${as[@]}" "$bin/initdb" -D "$dir/data" -A trust -U postgres --no-sync -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 || {
	echo "postgres: initdb failed; log follows" >&2
	cat "$dir/initdb.log" >&2
	exit 1
}
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 \
	-o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
	start >&2 || {
	echo "postgres: start failed; log follows" >&2
	cat "$dir/log" >&2
	exit 1
}

# Stop the server when the parent exits.
(
	while kill -0 "$parent" 2>/dev/null; do sleep 1; done
	"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
	rm -rf "$dir"
) </dev/null >/dev/null 2>&1 &

echo "postgres: 127.0.0.1:$port (data $dir/data, log $dir/log)" >&2
echo "export SINKBATCH_POSTGRES_DSN=postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
