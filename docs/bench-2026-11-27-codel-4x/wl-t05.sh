#!/bin/sh
# wirelane with a CoDel target of 500us and interval of 10ms
exec /tmp/wl-head --codel-target 500us --codel-interval 10ms "$@"
