#!/bin/sh
# wirelane with CoDel's target at 1ms and interval at 20ms.
# Usage: DAEMON=path/to/wirelane wl-t1.sh ARGS (the lab passes ARGS)
exec "${DAEMON:?}" --codel-target 1ms --codel-interval 20ms "$@"
