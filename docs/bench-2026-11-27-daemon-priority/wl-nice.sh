#!/bin/sh
# Usage: NICE=10 DAEMON=path/to/wirelane wl-nice.sh ARGS (the lab passes ARGS)
exec nice -n -"${NICE:-10}" "${DAEMON:?}" "$@"
