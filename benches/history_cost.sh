#!/usr/bin/env bash
# What the job history costs PostgreSQL per job, in instructions (issue 33.3):
# counted, because wall-clock A/B runs on a shared 2-core machine cannot
# resolve a few percent (BENCHMARKS.md, "Where the job history's cost goes").
#
#   benches/history_cost.sh [VARIANT.sql ...]     (as root; needs valgrind)
#
# Makes a scratch cluster in a temp dir (PostgreSQL 15, as the `postgres` user;
# a Unix socket only, no TCP), applies framework/migrations to schema `b`, then
# for "off" (the history switched off, as `set_job_history(false)` does: the
# trigger's 'history_off' argument and no `enqueued` default), "shipped" and each VARIANT.sql (DDL
# run after the migrations, in a database of its own, with `b` as search_path)
# runs the job lifecycle N times in a single-user backend under callgrind:
# the enqueue's INSERT; tenure_claim with step 0's CAS; twice tenure_admit and
# the next step's CAS; each its own transaction. Prints
#   history_cost: variant=NAME instructions_per_job=I
# where I = (count(N = 400) - count(N = 100)) / 300, which takes out the
# start, the warm-up and the shutdown. About a minute per variant.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pg_bin=/usr/lib/postgresql/15/bin
command -v valgrind >/dev/null || { echo "history_cost: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
[ -x "$pg_bin/postgres" ] || { echo "history_cost: needs $pg_bin (scripts/setup.sh)" >&2; exit 1; }

work=$(mktemp -d /tmp/tenure-history-cost.XXXXXX)
chown postgres "$work"
as_pg() { runuser -u postgres -- "$@"; }
cleanup() { # our own server, if a step failed while it ran
  if [ -f "$work/data/postmaster.pid" ]; then
    as_pg "$pg_bin/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
as_pg "$pg_bin/initdb" -D "$work/data" -A trust -U postgres >/dev/null

# Applies the migrations (and a variant's DDL) through a server of our own on
# a socket in $work, stopped again by pg_ctl before the counted runs.
prepare() { # db, variant file or ""
  as_pg "$pg_bin/pg_ctl" -D "$work/data" -l "$work/log" -w \
    -o "-c listen_addresses= -k $work -c fsync=off" start >/dev/null
  local psql=(psql -h "$work" -U postgres -q -v ON_ERROR_STOP=1)
  "${psql[@]}" -d postgres -c "CREATE DATABASE $1" -c "\c $1" -c "CREATE SCHEMA b"
  for f in "$root"/framework/migrations/*.sql ${2:+"$2"}; do
    PGOPTIONS="-c search_path=b" "${psql[@]}" -d "$1" -f "$f" >/dev/null
  done
  as_pg "$pg_bin/pg_ctl" -D "$work/data" -w stop >/dev/null
}

lifecycle() { # n: the counted input for postgres --single -j
  cat <<EOF
TRUNCATE b.jobs, b.job_events;

VACUUM b.guard_admissions;

DO \$\$
DECLARE id uuid;
BEGIN
  FOR i IN 1..$1 LOOP
    id := gen_random_uuid();
    INSERT INTO b.jobs (id, job_type, input) VALUES (id, 'bench', '{"a":1}');
    COMMIT;
    PERFORM * FROM b.tenure_claim(id, 5, false, true);
    PERFORM b.tenure_step_cas(id, 5, 0, '{"s":0}', false);
    COMMIT;
    PERFORM b.tenure_admit(id, 5, 1);
    PERFORM b.tenure_step_cas(id, 5, 1, '{"s":1}', false);
    COMMIT;
    PERFORM b.tenure_admit(id, 5, 2);
    PERFORM b.tenure_step_cas(id, 5, 2, '{"s":2}', true);
    COMMIT;
  END LOOP;
END \$\$;

EOF
}

count() { # db, n -> instructions
  lifecycle "$2" > "$work/in.sql"
  chmod 644 "$work/in.sql"
  as_pg valgrind --tool=callgrind --callgrind-out-file=/dev/null \
    "$pg_bin/postgres" --single -j -D "$work/data" "$1" < "$work/in.sql" 2>&1 |
    grep -o 'Collected : [0-9]*' | grep -o '[0-9]*$'
}

measure() { # name, db
  local small large
  small=$(count "$2" 100)
  large=$(count "$2" 400)
  echo "history_cost: variant=$1 instructions_per_job=$(( (large - small) / 300 ))"
}

printf "%s\n" "DROP TRIGGER jobs_change ON jobs;" \
  "CREATE TRIGGER jobs_change BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION tenure_job_change('history_off');" \
  "ALTER TABLE jobs ALTER COLUMN trail SET DEFAULT '{}';" > "$work/off.sql"
prepare v_off "$work/off.sql"
measure off v_off
prepare v_shipped ""
measure shipped v_shipped
i=0
for v in "$@"; do
  i=$((i + 1))
  prepare "v_$i" "$(realpath "$v")"
  measure "$(basename "$v" .sql)" "v_$i"
done
