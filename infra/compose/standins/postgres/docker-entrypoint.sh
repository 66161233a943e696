#!/bin/sh
# First start: a cluster owned by POSTGRES_USER with POSTGRES_PASSWORD, the database
# POSTGRES_DB, the init scripts; every start: the command, as postgres.
set -eu
case "${1:-postgres}" in -*) set -- postgres "$@" ;; esac
if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec gosu postgres "$0" "$@"
fi
if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?the postgres stand-in needs POSTGRES_PASSWORD, as the official image does}"
    user="${POSTGRES_USER:-postgres}"
    database="${POSTGRES_DB:-$user}"
    password_file=$(mktemp)
    printf '%s' "$POSTGRES_PASSWORD" > "$password_file"
    # UTF-8, as the official image's en_US.utf8 locale gives (minbase has no locale: SQL_ASCII).
    initdb --username="$user" --pwfile="$password_file" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA"
    rm -f "$password_file"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start
    if [ "$database" != postgres ]; then
        psql -v ON_ERROR_STOP=1 --username "$user" --dbname postgres -c "CREATE DATABASE \"$database\""
    fi
    for script in /docker-entrypoint-initdb.d/*; do
        case "$script" in
            *.sql) psql -v ON_ERROR_STOP=1 --username "$user" --dbname "$database" -f "$script" ;;
            *.sh) . "$script" ;;
            *) [ -e "$script" ] && echo "ignoring $script" ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop
fi
exec "$@"
