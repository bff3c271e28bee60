#!/bin/sh
# wirelane with CoDel's target at 500us and interval at 10ms.
# Usage: DAEMON=path/to/wirelane wl-t05.sh ARGS (the lab passes ARGS)
exec "${DAEMON:?}" --codel-target 500us --codel-interval 10ms "$@"
