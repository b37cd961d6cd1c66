#!/bin/sh
# A*-PO Studio's container entrypoint (tini runs it; it execs the command, by default `python -m app ... --public`).
#
# Why: a Docker Space runs the container as uid 1000, and `docker run -v /host/dir:/data` mounts a host folder with
# the host's owner, so the data folder may not be writable, and every write would then fail deep inside the app.
# This writes a probe file into the data folder ($A2PO_STUDIO_DATA, default /data). If that fails:
#   - by default it falls back to $A2PO_STUDIO_FALLBACK_DATA (default /tmp/a2po-data, the container's own disk)
#     with a loud warning: the studio works, but nothing it writes survives the container;
#   - with A2PO_STUDIO_REQUIRE_DATA=1 it exits with status 73 and says how to fix the folder instead.
# Cache variables that point into the data folder move with it. The database folder ($A2PO_STUDIO_DB_DIR, when
# set) gets the same check, with $A2PO_STUDIO_FALLBACK_DB_DIR (default /tmp/a2po-db) as its fallback.
set -eu

CACHE_VARS="HF_HOME GRADIO_TEMP_DIR A2PO_CACHE_DIR XDG_CACHE_HOME MPLCONFIGDIR TORCH_HOME TRITON_CACHE_DIR"

say() { printf 'a2po-entrypoint: %s\n' "$*" >&2; }

writable() {  # writable DIR: create it if needed, then create and remove a probe file as this user
    mkdir -p "$1" 2>/dev/null || return 1
    probe="$1/.a2po-write-test.$$"
    (: >"$probe") 2>/dev/null || return 1
    rm -f "$probe"
}

fix_hint() {
    echo "Make it writable by uid $(id -u) (on the host: sudo chown -R $(id -u):$(id -g) DIR), use a named volume" \
         "(docker run -v a2po-data:$1 ...), or run with --user set to the folder's owner."
}

uid=$(id -u)
data="${A2PO_STUDIO_DATA:-/data}"
[ "$data" = / ] || data="${data%/}"
if ! writable "$data"; then
    if [ "${A2PO_STUDIO_REQUIRE_DATA:-0}" = 1 ]; then
        say "ERROR: uid $uid cannot write to the data folder $data. $(fix_hint "$data")"
        exit 73
    fi
    fallback="${A2PO_STUDIO_FALLBACK_DATA:-/tmp/a2po-data}"
    say "################################################################################"
    say "WARNING: uid $uid cannot write to the data folder $data."
    say "Using $fallback instead: runs, checkpoints and the database will NOT survive this container."
    say "$(fix_hint "$data") Set A2PO_STUDIO_REQUIRE_DATA=1 to stop here instead."
    say "################################################################################"
    for var in $CACHE_VARS; do
        eval "value=\${$var:-}"
        case "$value" in
            "$data" | "$data"/*) export "$var=$fallback${value#"$data"}" ;;
        esac
    done
    data="$fallback"
    writable "$data" || { say "ERROR: uid $uid cannot write to $data either."; exit 73; }
fi
export A2PO_STUDIO_DATA="$data"

if [ -n "${A2PO_STUDIO_DB_DIR:-}" ] && ! writable "$A2PO_STUDIO_DB_DIR"; then
    db_fallback="${A2PO_STUDIO_FALLBACK_DB_DIR:-/tmp/a2po-db}"
    say "WARNING: uid $uid cannot write to the database folder $A2PO_STUDIO_DB_DIR; using $db_fallback."
    export A2PO_STUDIO_DB_DIR="$db_fallback"
    writable "$db_fallback" || { say "ERROR: uid $uid cannot write to $db_fallback either."; exit 73; }
fi

for var in $CACHE_VARS; do  # create the caches, so no library falls back to a temporary folder of its own
    eval "value=\${$var:-}"
    [ -z "$value" ] || mkdir -p "$value" 2>/dev/null || true
done

say "uid $uid; data in $data; database in ${A2PO_STUDIO_DB_DIR:-$data}."
[ "$#" -gt 0 ] || { say "ERROR: no command to run (the image's CMD is python -m app ...)."; exit 64; }
exec "$@"
