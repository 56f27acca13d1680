#!/bin/sh
# Test launcher agent (dtrainrun --launcher-agent): called as `local_agent.sh HOST COMMAND...`
# like rsh, it runs COMMAND on this machine, which thereby plays the part of HOST.
shift
exec sh -c "$*"
