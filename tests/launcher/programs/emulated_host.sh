#!/bin/sh
# Test wrapper: `emulated_host.sh SLOTS PROGRAM ARGS...` runs PROGRAM with DTRAIN_HOST_ID set so
# that ranks 0..SLOTS-1 believe they share one host, the next SLOTS another, and so on: several
# hosts emulated on one machine, for where real ones (network namespaces) are not available.
slots=$1
shift
rank=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:?no rank in the environment}}
DTRAIN_HOST_ID="emulated-host-$((rank / slots))"
export DTRAIN_HOST_ID
exec "$@"
