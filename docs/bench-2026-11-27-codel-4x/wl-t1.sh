#!/bin/sh
# wirelane with a CoDel target of 1ms and interval of 20ms
exec /tmp/wl-head --codel-target 1ms --codel-interval 20ms "$@"
